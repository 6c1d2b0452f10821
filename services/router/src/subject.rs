//! Certificate subjects (X.509 distinguished names), as `[mtls.subjects]`
//! names them and as client certificates carry them.
//!
//! A [`Subject`] is its attributes (`CN`, `O`, `OU`, …, or a dotted OID)
//! with their values. Two subjects are the same when they have the same
//! attributes with the same values, in any order: `CN=bot,O=Acme` (RFC
//! 4514, as `openssl x509 -subject -nameopt RFC2253` prints it),
//! `O = Acme, CN = bot` (openssl's default) and `/O=Acme/CN=bot` (the form
//! `openssl req -subj` takes) all name the same certificate subject. Values
//! are compared exactly (case included).
//!
//! Only what a subject needs is read from a certificate's DER: the
//! certificate has been verified against the configured CA before this
//! sees it, and anything unexpected reads as no subject.

use std::fmt;
use std::hash::{Hash, Hasher};

/// A distinguished name.
#[derive(Clone, Debug)]
pub struct Subject {
    /// Attributes sorted, for comparison.
    sorted: Box<[(Box<str>, Box<str>)]>,
    /// RFC 4514 text (most specific attribute first), for records and logs.
    text: Box<str>,
}

impl PartialEq for Subject {
    fn eq(&self, other: &Subject) -> bool {
        self.sorted == other.sorted
    }
}

impl Eq for Subject {}

impl Hash for Subject {
    fn hash<H: Hasher>(&self, state: &mut H) {
        self.sorted.hash(state);
    }
}

impl fmt::Display for Subject {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.text)
    }
}

impl Subject {
    /// From attributes in the certificate's order (least specific first).
    fn new(attributes: Vec<(String, String)>) -> Subject {
        let text = attributes.iter().rev().map(|(t, v)| format!("{t}={}", escape(v))).collect::<Vec<_>>().join(",");
        let mut sorted: Vec<(Box<str>, Box<str>)> =
            attributes.into_iter().map(|(t, v)| (t.into_boxed_str(), v.into_boxed_str())).collect();
        sorted.sort();
        Subject { sorted: sorted.into(), text: text.into_boxed_str() }
    }

    /// The subject written as text: RFC 4514 (`CN=bot,O=Acme`, with `\`
    /// escapes), openssl's `O = Acme, CN = bot`, or `/O=Acme/CN=bot`.
    pub fn parse(written: &str) -> Result<Subject, String> {
        let written = written.trim();
        // Kept in the certificate's order: RFC 4514 writes it backwards.
        let pieces = match written.strip_prefix('/') {
            Some(slashed) => split_unescaped(slashed, &['/']),
            None => split_unescaped(written, &[',', '+', ';']).into_iter().rev().collect(),
        };
        let mut attributes = Vec::new();
        for piece in pieces {
            let (kind, value) = piece
                .split_once('=')
                .ok_or_else(|| format!("{:?} is not TYPE=VALUE (such as CN=build-bot)", piece.trim()))?;
            let kind =
                attribute_type(kind.trim()).ok_or_else(|| format!("{:?} is not an attribute type", kind.trim()))?;
            let value = unescape(value.trim()).ok_or_else(|| format!("{:?} has a bad escape", value.trim()))?;
            if value.is_empty() {
                return Err(format!("{kind} has no value"));
            }
            attributes.push((kind, value));
        }
        if attributes.is_empty() {
            return Err("is empty".into());
        }
        Ok(Subject::new(attributes))
    }

    /// The subject of a certificate (DER), if it can be read.
    pub fn of_certificate(der: &[u8]) -> Option<Subject> {
        let certificate = Der(der).expect(SEQUENCE)?;
        let mut tbs = Der(Der(certificate).expect(SEQUENCE)?);
        // version [0] (optional), serial, signature algorithm, issuer, validity, subject
        let mut next = tbs.next()?;
        if next.tag == 0xa0 {
            next = tbs.next()?;
        }
        for _ in 0..4 {
            next = tbs.next()?;
        }
        if next.tag != SEQUENCE {
            return None;
        }
        let mut rdns = Der(next.value);
        let mut attributes = Vec::new();
        while !rdns.0.is_empty() {
            let mut set = Der(rdns.expect(SET)?);
            while !set.0.is_empty() {
                let mut pair = Der(set.expect(SEQUENCE)?);
                let oid = pair.expect(OID)?;
                let value = pair.next()?;
                attributes.push((oid_name(oid)?, text_of(&value)?));
            }
        }
        (!attributes.is_empty()).then(|| Subject::new(attributes))
    }
}

const SEQUENCE: u8 = 0x30;
const SET: u8 = 0x31;
const OID: u8 = 0x06;

/// One DER element: its tag, contents, and the whole encoding.
struct Element<'a> {
    tag: u8,
    value: &'a [u8],
    whole: &'a [u8],
}

/// DER elements one after another (definite lengths, single-byte tags).
struct Der<'a>(&'a [u8]);

impl<'a> Der<'a> {
    fn next(&mut self) -> Option<Element<'a>> {
        let all = self.0;
        let (&tag, rest) = all.split_first()?;
        if tag & 0x1f == 0x1f {
            return None;
        }
        let (&first, rest) = rest.split_first()?;
        let (len, rest) = if first < 0x80 {
            (usize::from(first), rest)
        } else {
            let n = usize::from(first & 0x7f);
            if n == 0 || n > 4 || rest.len() < n {
                return None;
            }
            (rest[..n].iter().fold(0usize, |len, &b| len << 8 | usize::from(b)), &rest[n..])
        };
        if rest.len() < len {
            return None;
        }
        let header = all.len() - rest.len();
        self.0 = &rest[len..];
        Some(Element { tag, value: &rest[..len], whole: &all[..header + len] })
    }

    fn expect(&mut self, tag: u8) -> Option<&'a [u8]> {
        self.next().filter(|e| e.tag == tag).map(|e| e.value)
    }
}

/// The attribute types with names (RFC 4514 and the usual others).
const NAMES: &[(&str, &str)] = &[
    ("2.5.4.3", "CN"),
    ("2.5.4.4", "SN"),
    ("2.5.4.5", "SERIALNUMBER"),
    ("2.5.4.6", "C"),
    ("2.5.4.7", "L"),
    ("2.5.4.8", "ST"),
    ("2.5.4.9", "STREET"),
    ("2.5.4.10", "O"),
    ("2.5.4.11", "OU"),
    ("2.5.4.12", "TITLE"),
    ("2.5.4.42", "GIVENNAME"),
    ("0.9.2342.19200300.100.1.1", "UID"),
    ("0.9.2342.19200300.100.1.25", "DC"),
    ("1.2.840.113549.1.9.1", "EMAILADDRESS"),
];

/// An attribute type as written: a name (any case; `E`, `EMAIL` and `S`
/// as openssl spells them) or a dotted OID, as the name it has.
fn attribute_type(written: &str) -> Option<String> {
    let upper = written.to_ascii_uppercase();
    let upper = match upper.as_str() {
        "E" | "EMAIL" => "EMAILADDRESS".to_owned(),
        "S" => "ST".to_owned(),
        _ => upper,
    };
    if let Some((_, name)) = NAMES.iter().find(|(oid, name)| *name == upper || *oid == upper) {
        return Some((*name).to_owned());
    }
    let dotted = upper.strip_prefix("OID.").unwrap_or(&upper);
    let is_oid = dotted.split('.').count() >= 2
        && dotted.split('.').all(|arc| !arc.is_empty() && arc.bytes().all(|b| b.is_ascii_digit()));
    is_oid.then(|| dotted.to_owned())
}

/// An OID's contents, as its attribute name or dotted form.
fn oid_name(der: &[u8]) -> Option<String> {
    let mut arcs: Vec<u64> = Vec::new();
    let mut arc: u64 = 0;
    for &b in der {
        arc = arc.checked_mul(128)? | u64::from(b & 0x7f);
        if b & 0x80 == 0 {
            if arcs.is_empty() {
                let first = (arc / 40).min(2);
                arcs.push(first);
                arcs.push(arc - first * 40);
            } else {
                arcs.push(arc);
            }
            arc = 0;
        }
    }
    if arcs.is_empty() || der.last().is_some_and(|b| b & 0x80 != 0) {
        return None;
    }
    let dotted = arcs.iter().map(u64::to_string).collect::<Vec<_>>().join(".");
    Some(NAMES.iter().find(|(oid, _)| *oid == dotted).map_or(dotted, |(_, name)| (*name).to_owned()))
}

/// An attribute's value as text; a type that is not a string is `#` and
/// its encoding in hex, as RFC 4514 writes it.
fn text_of(value: &Element<'_>) -> Option<String> {
    let bytes = value.value;
    match value.tag {
        // UTF8String; PrintableString, IA5String, NumericString, VisibleString
        0x0c | 0x13 | 0x16 | 0x12 | 0x1a => String::from_utf8(bytes.to_vec()).ok(),
        // TeletexString, read as Latin-1 as everyone does
        0x14 => Some(bytes.iter().map(|&b| char::from(b)).collect()),
        // BMPString (UTF-16BE)
        0x1e => {
            let units: Vec<u16> =
                bytes.chunks(2).map(|c| <[u8; 2]>::try_from(c).ok().map(u16::from_be_bytes)).collect::<Option<_>>()?;
            String::from_utf16(&units).ok()
        }
        // UniversalString (UTF-32BE)
        0x1c => bytes
            .chunks(4)
            .map(|c| <[u8; 4]>::try_from(c).ok().and_then(|c| char::from_u32(u32::from_be_bytes(c))))
            .collect(),
        _ => Some(format!("#{}", value.whole.iter().map(|b| format!("{b:02x}")).collect::<String>())),
    }
}

/// Splits at the separators not escaped by `\`.
fn split_unescaped<'a>(text: &'a str, separators: &[char]) -> Vec<&'a str> {
    let mut pieces = Vec::new();
    let (mut start, mut escaped) = (0, false);
    for (i, c) in text.char_indices() {
        if escaped {
            escaped = false;
        } else if c == '\\' {
            escaped = true;
        } else if separators.contains(&c) {
            pieces.push(&text[start..i]);
            start = i + c.len_utf8();
        }
    }
    pieces.push(&text[start..]);
    pieces.into_iter().filter(|p| !p.trim().is_empty()).collect()
}

/// RFC 4514 `\` escapes: a special character, or two hex digits (a byte of
/// the UTF-8 value).
fn unescape(value: &str) -> Option<String> {
    let mut bytes = Vec::with_capacity(value.len());
    let mut rest = value.as_bytes();
    while let Some((&b, after)) = rest.split_first() {
        rest = after;
        if b != b'\\' {
            bytes.push(b);
            continue;
        }
        let (&next, after) = rest.split_first()?;
        let hex = |c: u8| char::from(c).to_digit(16);
        match (hex(next), after.first().and_then(|&c| hex(c))) {
            (Some(high), Some(low)) => {
                bytes.push((high * 16 + low) as u8);
                rest = &after[1..];
            }
            _ => {
                bytes.push(next);
                rest = after;
            }
        }
    }
    String::from_utf8(bytes).ok()
}

/// A value as RFC 4514 writes it.
fn escape(value: &str) -> String {
    let mut out = String::with_capacity(value.len());
    let last = value.chars().count().saturating_sub(1);
    for (i, c) in value.chars().enumerate() {
        let special = matches!(c, ',' | '+' | '"' | '\\' | '<' | '>' | ';')
            || (i == 0 && matches!(c, '#' | ' '))
            || (i == last && c == ' ');
        if special && !(i == 0 && c == '#' && value.len() > 1 && value[1..].bytes().all(|b| b.is_ascii_hexdigit())) {
            out.push('\\');
        }
        out.push(c);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_written_forms_name_the_same_subject() {
        let rfc = Subject::parse("CN=build-bot,O=Acme").unwrap();
        for same in
            ["O = Acme, CN = build-bot", "/O=Acme/CN=build-bot", "cn=build-bot, o=Acme", "2.5.4.3=build-bot,O=Acme"]
        {
            assert_eq!(Subject::parse(same).unwrap(), rfc, "{same}");
        }
        assert_eq!(rfc.to_string(), "CN=build-bot,O=Acme");
        assert_eq!(Subject::parse("/O=Acme/CN=build-bot").unwrap().to_string(), "CN=build-bot,O=Acme");
        assert_ne!(Subject::parse("CN=Build-bot,O=Acme").unwrap(), rfc, "values are exact");
        assert_ne!(Subject::parse("CN=build-bot").unwrap(), rfc, "all attributes count");
        let escaped = Subject::parse(r"CN=Smith\, J.,O=Caf\C3\A9").unwrap();
        assert_eq!(escaped.sorted[0], ("CN".into(), "Smith, J.".into()));
        assert_eq!(escaped.sorted[1], ("O".into(), "Café".into()));
        assert_eq!(escaped.to_string(), r"CN=Smith\, J.,O=Café");
        for bad in ["", "build-bot", "CN=", "XX=1", r"CN=a\"] {
            assert!(Subject::parse(bad).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn a_certificate_gives_its_subject_and_garbage_gives_none() {
        let dir = std::env::temp_dir().join(format!("sb-subject-unit-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let out = std::process::Command::new("openssl")
            .args(["req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes"])
            .args(["-days", "1", "-keyout", "k.pem", "-outform", "DER", "-out", "c.der"])
            .args(["-utf8", "-subj", "/C=FR/O=Café, Inc./OU=bots/CN=build-bot/emailAddress=bot@acme.test"])
            .current_dir(&dir)
            .output()
            .unwrap();
        assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
        let der = std::fs::read(dir.join("c.der")).unwrap();
        let subject = Subject::of_certificate(&der).unwrap();
        assert_eq!(subject.to_string(), r"EMAILADDRESS=bot@acme.test,CN=build-bot,OU=bots,O=Café\, Inc.,C=FR");
        let written = Subject::parse("/C=FR/O=Café\\, Inc./OU=bots/CN=build-bot/E=bot@acme.test").unwrap();
        assert_eq!(subject, written);
        for cut in [0, 1, 10, der.len() / 2, der.len() - 1] {
            assert!(Subject::of_certificate(&der[..cut]).is_none(), "cut at {cut}");
        }
        assert!(Subject::of_certificate(&[0x30, 0x84, 0xff, 0xff, 0xff, 0xff]).is_none());
    }
}
