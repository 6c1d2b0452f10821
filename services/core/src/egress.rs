//! Where the router may connect to (the SSRF guard): upstreams, and every
//! URL it fetches for OAuth. A host's addresses are resolved, and each one
//! checked, at each connection (so a name that starts resolving elsewhere
//! is checked again); loopback, private, link-local, shared (carrier-grade
//! NAT) and cloud-metadata addresses are refused unless [`Egress`] allows
//! their kind or a network that holds them. Unspecified, multicast and
//! broadcast addresses are never reached. Nothing here follows redirects.

use std::fmt;
use std::io;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use std::time::Duration;

use tokio::net::TcpStream;

/// The kinds of addresses refused unless allowed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    /// 127.0.0.0/8, ::1.
    Loopback,
    /// 10.0.0.0/8, 172.16.0.0/12, 192.168.0.0/16, fc00::/7.
    Private,
    /// 169.254.0.0/16, fe80::/10 (but the metadata addresses).
    LinkLocal,
    /// 100.64.0.0/10 (carrier-grade NAT, also some clouds' internal services).
    Shared,
    /// Cloud instance metadata: 169.254.169.254, 169.254.170.2,
    /// 100.100.100.200, fd00:ec2::254.
    Metadata,
}

impl Kind {
    pub const ALL: [Kind; 5] = [Kind::Loopback, Kind::Private, Kind::LinkLocal, Kind::Shared, Kind::Metadata];

    pub fn name(self) -> &'static str {
        match self {
            Kind::Loopback => "loopback",
            Kind::Private => "private",
            Kind::LinkLocal => "link_local",
            Kind::Shared => "shared",
            Kind::Metadata => "metadata",
        }
    }
}

/// What kind of address `ip` is, if one of the guarded kinds; `Err` for
/// addresses never reached.
pub fn kind_of(ip: IpAddr) -> Result<Option<Kind>, &'static str> {
    let ip = match ip {
        // An IPv4 address written as IPv6 is judged as IPv4.
        IpAddr::V6(v6) => v6.to_ipv4_mapped().map_or(IpAddr::V6(v6), IpAddr::V4),
        v4 => v4,
    };
    match ip {
        IpAddr::V4(v4) => {
            let [a, b, _, _] = v4.octets();
            if v4.is_unspecified() || v4.is_multicast() || v4.is_broadcast() || a == 0 {
                return Err("an unspecified, multicast or broadcast address");
            }
            let metadata =
                [Ipv4Addr::new(169, 254, 169, 254), Ipv4Addr::new(169, 254, 170, 2), Ipv4Addr::new(100, 100, 100, 200)];
            Ok(if metadata.contains(&v4) {
                Some(Kind::Metadata)
            } else if v4.is_loopback() {
                Some(Kind::Loopback)
            } else if v4.is_private() {
                Some(Kind::Private)
            } else if v4.is_link_local() {
                Some(Kind::LinkLocal)
            } else if a == 100 && (64..128).contains(&b) {
                Some(Kind::Shared)
            } else {
                None
            })
        }
        IpAddr::V6(v6) => {
            let first = v6.segments()[0];
            if v6.is_unspecified() || v6.is_multicast() {
                return Err("an unspecified or multicast address");
            }
            Ok(if v6 == Ipv6Addr::new(0xfd00, 0xec2, 0, 0, 0, 0, 0, 0x254) {
                Some(Kind::Metadata)
            } else if v6.is_loopback() {
                Some(Kind::Loopback)
            } else if first & 0xfe00 == 0xfc00 {
                Some(Kind::Private)
            } else if first & 0xffc0 == 0xfe80 {
                Some(Kind::LinkLocal)
            } else {
                None
            })
        }
    }
}

/// A network, `ADDRESS/PREFIX`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Network {
    address: IpAddr,
    prefix: u8,
}

impl Network {
    pub fn parse(text: &str) -> Result<Network, String> {
        let (address, prefix) = text.split_once('/').ok_or_else(|| format!("{text:?} is not ADDRESS/PREFIX"))?;
        let address: IpAddr = address.trim().parse().map_err(|_| format!("{address:?} is not an IP address"))?;
        let max = if address.is_ipv4() { 32 } else { 128 };
        let prefix: u8 = prefix
            .trim()
            .parse()
            .ok()
            .filter(|p| *p <= max)
            .ok_or_else(|| format!("{prefix:?} is not a prefix length"))?;
        Ok(Network { address, prefix })
    }

    pub fn contains(&self, ip: IpAddr) -> bool {
        match (self.address, ip) {
            (IpAddr::V4(net), IpAddr::V4(ip)) => {
                let mask = u32::MAX.checked_shl(32 - u32::from(self.prefix)).unwrap_or(0);
                u32::from(net) & mask == u32::from(ip) & mask
            }
            (IpAddr::V6(net), IpAddr::V6(ip)) => {
                let mask = u128::MAX.checked_shl(128 - u32::from(self.prefix)).unwrap_or(0);
                u128::from(net) & mask == u128::from(ip) & mask
            }
            (IpAddr::V4(_), IpAddr::V6(v6)) => v6.to_ipv4_mapped().is_some_and(|v4| self.contains(IpAddr::V4(v4))),
            (IpAddr::V6(_), IpAddr::V4(_)) => false,
        }
    }
}

impl fmt::Display for Network {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}", self.address, self.prefix)
    }
}

/// The addresses the router may connect to beyond public ones.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Egress {
    kinds: Vec<Kind>,
    networks: Vec<Network>,
}

impl Egress {
    /// Public addresses only.
    pub fn public_only() -> Egress {
        Egress::default()
    }

    /// Every kind allowed (public, loopback, private, …; never the addresses
    /// never reached): for a URL a person gives on the command line.
    pub fn anywhere() -> Egress {
        Egress { kinds: Kind::ALL.to_vec(), networks: Vec::new() }
    }

    /// From `[egress] allow`: kind names and networks.
    pub fn parse(allow: &[String]) -> Result<Egress, Vec<(usize, String)>> {
        let mut egress = Egress::default();
        let mut bad = Vec::new();
        for (i, entry) in allow.iter().enumerate() {
            if let Some(kind) = Kind::ALL.iter().find(|k| k.name() == entry.trim()) {
                egress.kinds.push(*kind);
            } else {
                match Network::parse(entry) {
                    Ok(network) => egress.networks.push(network),
                    Err(_) => bad.push((
                        i,
                        format!(
                            "{entry:?} is not \"loopback\", \"private\", \"link_local\", \"shared\", \"metadata\" \
                             or a network such as \"10.20.0.0/16\""
                        ),
                    )),
                }
            }
        }
        if bad.is_empty() {
            Ok(egress)
        } else {
            Err(bad)
        }
    }

    /// Whether `ip` may be connected to; `Err` says why not.
    pub fn check(&self, ip: IpAddr) -> Result<(), String> {
        match kind_of(ip) {
            Err(never) => Err(format!("{ip} is {never}, never connected to")),
            Ok(None) => Ok(()),
            Ok(Some(_)) if self.networks.iter().any(|n| n.contains(ip)) => Ok(()),
            Ok(Some(kind)) if self.kinds.contains(&kind) => Ok(()),
            Ok(Some(kind)) => Err(format!(
                "{ip} is a {} address, which the router does not connect to unless egress.allow says so \
                 (\"{}\" or a network holding it)",
                kind.name().replace('_', "-"),
                kind.name()
            )),
        }
    }

    /// The addresses of `host:port` this guard lets through (an IP literal
    /// is checked as it is); an error naming the host when there are none.
    pub async fn resolve(&self, host: &str, port: u16) -> io::Result<Vec<SocketAddr>> {
        let bare = host.trim_start_matches('[').trim_end_matches(']');
        let found: Vec<SocketAddr> = match bare.parse::<IpAddr>() {
            Ok(ip) => vec![SocketAddr::new(ip, port)],
            Err(_) => tokio::net::lookup_host((bare, port)).await?.collect(),
        };
        let mut refusals = Vec::new();
        let allowed: Vec<SocketAddr> = found
            .into_iter()
            .filter(|a| match self.check(a.ip()) {
                Ok(()) => true,
                Err(why) => {
                    refusals.push(why);
                    false
                }
            })
            .collect();
        if allowed.is_empty() {
            let why = refusals.into_iter().next().unwrap_or_else(|| "no address".into());
            return Err(io::Error::new(io::ErrorKind::PermissionDenied, format!("{host}: {why}")));
        }
        Ok(allowed)
    }

    /// A TCP connection to `host:port` (resolved and checked here), within
    /// `timeout`, with `TCP_NODELAY`.
    pub async fn connect(&self, host: &str, port: u16, timeout: Duration) -> io::Result<TcpStream> {
        let deadline = tokio::time::Instant::now() + timeout;
        let timed_out =
            || io::Error::new(io::ErrorKind::TimedOut, format!("connect to {host}:{port} timed out after {timeout:?}"));
        let addresses =
            tokio::time::timeout_at(deadline, self.resolve(host, port)).await.map_err(|_| timed_out())??;
        let mut last = None;
        for address in addresses {
            match tokio::time::timeout_at(deadline, TcpStream::connect(address)).await {
                Ok(Ok(tcp)) => {
                    tcp.set_nodelay(true)?;
                    return Ok(tcp);
                }
                Ok(Err(e)) => last = Some(e),
                Err(_) => return Err(timed_out()),
            }
        }
        Err(last.unwrap_or_else(timed_out))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ip(text: &str) -> IpAddr {
        text.parse().unwrap()
    }

    #[test]
    fn guarded_kinds_are_refused_unless_allowed() {
        let public = Egress::public_only();
        for (address, kind) in [
            ("127.0.0.1", "loopback"),
            ("::1", "loopback"),
            ("::ffff:127.0.0.1", "loopback"),
            ("10.1.2.3", "private"),
            ("172.20.0.1", "private"),
            ("192.168.1.1", "private"),
            ("fd12::1", "private"),
            ("169.254.10.10", "link-local"),
            ("fe80::1", "link-local"),
            ("100.64.0.1", "shared"),
            ("169.254.169.254", "metadata"),
            ("fd00:ec2::254", "metadata"),
            ("100.100.100.200", "metadata"),
        ] {
            let err = public.check(ip(address)).unwrap_err();
            assert!(err.contains(kind), "{address}: {err}");
        }
        for never in ["0.0.0.0", "::", "224.0.0.1", "255.255.255.255", "0.1.2.3", "ff02::1"] {
            let allowed = Egress::parse(&["0.0.0.0/0".into(), "::/0".into()]).unwrap();
            assert!(allowed.check(ip(never)).unwrap_err().contains("never"), "{never}");
        }
        for open in ["93.184.216.34", "2606:2800:220:1::1", "172.32.0.1", "100.128.0.1"] {
            assert!(public.check(ip(open)).is_ok(), "{open}");
        }
        let some = Egress::parse(&["loopback".into(), "10.20.0.0/16".into()]).unwrap();
        assert!(some.check(ip("127.0.0.1")).is_ok() && some.check(ip("::1")).is_ok());
        assert!(some.check(ip("10.20.9.9")).is_ok());
        assert!(some.check(ip("10.21.0.1")).is_err());
        assert!(some.check(ip("169.254.169.254")).is_err(), "metadata needs its own allowance");
        let link = Egress::parse(&["link_local".into()]).unwrap();
        assert!(link.check(ip("169.254.1.1")).is_ok() && link.check(ip("169.254.169.254")).is_err());
        assert_eq!(Egress::parse(&["loopback".into(), "nowhere".into(), "10.0.0.0/33".into()]).unwrap_err().len(), 2);
    }

    #[tokio::test]
    async fn resolution_is_checked_before_connecting() {
        let public = Egress::public_only();
        let err = public.connect("localhost", 9, Duration::from_secs(1)).await.unwrap_err();
        assert_eq!(err.kind(), io::ErrorKind::PermissionDenied, "{err}");
        assert!(err.to_string().starts_with("localhost: ") && err.to_string().contains("loopback"), "{err}");
        let err = public.connect("[::1]", 9, Duration::from_secs(1)).await.unwrap_err();
        assert_eq!(err.kind(), io::ErrorKind::PermissionDenied, "{err}");
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = listener.local_addr().unwrap().port();
        let loopback = Egress::parse(&["loopback".into()]).unwrap();
        assert!(loopback.connect("127.0.0.1", port, Duration::from_secs(1)).await.is_ok());
    }
}
