//! Time as the router records it: Unix milliseconds, and their RFC 3339
//! form (UTC) for people and APIs.

/// Milliseconds since the Unix epoch.
pub fn now_ms() -> i64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_millis() as i64)
}

/// Parses `YYYY-MM-DD[THH:MM[:SS[.fff]]][Z]` as UTC.
pub fn parse_time(t: &str) -> Option<i64> {
    let t = t.strip_suffix('Z').unwrap_or(t);
    let (date, time) = t.split_once(['T', ' ']).unwrap_or((t, "00:00:00"));
    let mut d = date.split('-').map(|p| p.parse::<i64>().ok());
    let (y, m, day) = (d.next()??, d.next()??, d.next()??);
    if d.next().is_some() || !(1..=12).contains(&m) || !(1..=31).contains(&day) {
        return None;
    }
    let mut parts = time.split(':');
    let h: i64 = parts.next()?.parse().ok()?;
    let min: i64 = parts.next().unwrap_or("0").parse().ok()?;
    let sec: f64 = parts.next().unwrap_or("0").parse().ok()?;
    if parts.next().is_some() || h > 23 || min > 59 || !(0.0..61.0).contains(&sec) {
        return None;
    }
    Some((days_from_civil(y, m, day) * 86_400 + h * 3600 + min * 60) * 1000 + (sec * 1000.0).round() as i64)
}

/// Unix milliseconds as `2026-11-22T08:00:00.000Z`.
pub fn format_time(ms: i64) -> String {
    let (days, rem) = (ms.div_euclid(86_400_000), ms.rem_euclid(86_400_000));
    let (y, m, d) = civil_from_days(days);
    format!(
        "{y:04}-{m:02}-{d:02}T{:02}:{:02}:{:02}.{:03}Z",
        rem / 3_600_000,
        rem / 60_000 % 60,
        rem / 1000 % 60,
        rem % 1000
    )
}

// Days since 1970-01-01 to and from a proleptic Gregorian date, by counting
// 400-year eras of 146,097 days from 0000-03-01.
fn days_from_civil(y: i64, m: i64, d: i64) -> i64 {
    let y = if m <= 2 { y - 1 } else { y };
    let era = y.div_euclid(400);
    let yoe = y - era * 400;
    let mp = (m + 9) % 12;
    let doy = (153 * mp + 2) / 5 + d - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    era * 146_097 + doe - 719_468
}

fn civil_from_days(z: i64) -> (i64, i64, i64) {
    let z = z + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    (if m <= 2 { yoe + era * 400 + 1 } else { yoe + era * 400 }, m, d)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn times_round_trip() {
        assert_eq!(format_time(0), "1970-01-01T00:00:00.000Z");
        assert_eq!(parse_time("1970-01-01T00:00:00Z"), Some(0));
        let t = parse_time("2026-11-22T08:30:15.250Z").unwrap();
        assert_eq!(format_time(t), "2026-11-22T08:30:15.250Z");
        assert_eq!(parse_time("2024-02-29"), Some(1_709_164_800_000));
        assert_eq!(format_time(1_709_164_800_000), "2024-02-29T00:00:00.000Z");
        assert!(parse_time("2026-13-01").is_none());
        assert!(parse_time("yesterday").is_none());
    }
}
