//! What a reference may name: the operator's allow-lists (`--input-bucket`, `--input-host`) and the
//! addresses an `https://` reference may be fetched from.
//!
//! A host name is resolved here, every address it resolves to is checked, and the connection is then
//! pinned to the checked address (`https.rs`): a name cannot lead the server to its own loopback, the
//! private network or a cloud metadata service (SSRF), neither directly nor by resolving differently
//! at connect time (DNS rebinding). Such addresses pass only when the operator allow-listed the very
//! IP literally (`--input-host 10.0.0.7:8443`).

use std::collections::BTreeSet;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use super::RefError;

/// One `--input-host` entry: a host name (lower-cased) or an IP literal, with an optional port (any
/// port when absent).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HostRule {
    pub host: RuleHost,
    pub port: Option<u16>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RuleHost {
    Name(String),
    Ip(IpAddr),
}

impl HostRule {
    /// Parses `HOST[:PORT]`, `IPv4[:PORT]`, `[IPv6][:PORT]` or a bare IPv6 literal.
    pub fn parse(s: &str) -> Result<HostRule, String> {
        let s = s.trim();
        let bad = || format!("--input-host must be HOST, HOST:PORT, IP, IP:PORT or [IPv6]:PORT, not {s:?}");
        if s.is_empty() {
            return Err(bad());
        }
        if let Ok(ip) = s.parse::<IpAddr>() {
            return Ok(HostRule { host: RuleHost::Ip(ip), port: None });
        }
        let (host, port) = if let Some(rest) = s.strip_prefix('[') {
            let (h, after) = rest.split_once(']').ok_or_else(bad)?;
            let ip: Ipv6Addr = h.parse().map_err(|_| bad())?;
            let port = match after {
                "" => None,
                p => Some(p.strip_prefix(':').ok_or_else(bad)?.parse::<u16>().map_err(|_| bad())?),
            };
            return Ok(HostRule { host: RuleHost::Ip(IpAddr::V6(ip)), port });
        } else {
            match s.rsplit_once(':') {
                Some((h, p)) => (h, Some(p.parse::<u16>().map_err(|_| bad())?)),
                None => (s, None),
            }
        };
        if let Ok(ip) = host.parse::<Ipv4Addr>() {
            return Ok(HostRule { host: RuleHost::Ip(IpAddr::V4(ip)), port });
        }
        let ok = host.split('.').all(|l| !l.is_empty() && l.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-'));
        if !ok {
            return Err(bad());
        }
        Ok(HostRule { host: RuleHost::Name(host.to_ascii_lowercase()), port })
    }

    fn port_matches(&self, port: u16) -> bool {
        self.port.is_none_or(|p| p == port)
    }
}

/// The operator's allow-lists.
#[derive(Debug, Clone, Default)]
pub struct AllowLists {
    pub buckets: BTreeSet<String>,
    pub hosts: Vec<HostRule>,
}

impl AllowLists {
    pub fn new(buckets: &[String], hosts: &[String]) -> Result<AllowLists, String> {
        let mut set = BTreeSet::new();
        for b in buckets.iter().map(|b| b.trim()).filter(|b| !b.is_empty()) {
            if b.contains('/') {
                return Err(format!("--input-bucket takes a bucket name, not {b:?}"));
            }
            set.insert(b.to_string());
        }
        let hosts = hosts.iter().filter(|h| !h.trim().is_empty()).map(|h| HostRule::parse(h)).collect::<Result<_, _>>()?;
        Ok(AllowLists { buckets: set, hosts })
    }

    pub fn check_bucket(&self, bucket: &str) -> Result<(), RefError> {
        if self.buckets.contains(bucket) {
            return Ok(());
        }
        Err(RefError::Forbidden(format!("bucket {bucket:?} is not allowed: the operator allows it with --input-bucket {bucket}")))
    }

    /// Whether `https://host:port/` may be asked at all (before its addresses are looked at). `host`
    /// is the URL's host: a lower-case name, or an IP literal.
    pub fn check_host(&self, host: &UrlHost, port: u16) -> Result<(), RefError> {
        let allowed = self.hosts.iter().any(|r| {
            r.port_matches(port)
                && match (&r.host, host) {
                    (RuleHost::Name(n), UrlHost::Name(h)) => n == h,
                    (RuleHost::Ip(a), UrlHost::Ip(b)) => a == b,
                    _ => false,
                }
        });
        if allowed {
            return Ok(());
        }
        let shown = match host {
            UrlHost::Name(n) => n.clone(),
            UrlHost::Ip(IpAddr::V6(ip)) => format!("[{ip}]"),
            UrlHost::Ip(ip) => ip.to_string(),
        };
        Err(RefError::Forbidden(format!("host {shown}:{port} is not allowed: the operator allows it with --input-host {shown}:{port}")))
    }

    /// The address to connect to among those `host` resolved to: every one must be public, or
    /// allow-listed by IP literal (with a matching port); the first is used.
    pub fn check_addresses(&self, host: &str, port: u16, addrs: &[IpAddr]) -> Result<IpAddr, RefError> {
        let Some(first) = addrs.first() else {
            return Err(RefError::NotFound(format!("host {host} resolves to no address")));
        };
        for ip in addrs {
            if let Some(range) = forbidden_range(*ip) {
                if !self.literal_allows(*ip, port) {
                    return Err(RefError::Forbidden(format!(
                        "host {host} resolves to {ip} ({range}), which is refused unless the operator allows that address literally (--input-host {}:{port})",
                        match ip {
                            IpAddr::V6(v6) => format!("[{v6}]"),
                            v4 => v4.to_string(),
                        }
                    )));
                }
            }
        }
        Ok(*first)
    }

    fn literal_allows(&self, ip: IpAddr, port: u16) -> bool {
        let ip = canonical(ip);
        self.hosts.iter().any(|r| matches!(r.host, RuleHost::Ip(a) if canonical(a) == ip) && r.port_matches(port))
    }
}

/// A URL's host, as the allow-list compares it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum UrlHost {
    Name(String),
    Ip(IpAddr),
}

/// An IPv4-mapped IPv6 address as its IPv4 address (the same host either way).
fn canonical(ip: IpAddr) -> IpAddr {
    match ip {
        IpAddr::V6(v6) => v6.to_ipv4_mapped().map(IpAddr::V4).unwrap_or(ip),
        v4 => v4,
    }
}

/// The range an address belongs to when it must not be fetched from without being allow-listed:
/// loopback, private, shared (carrier-grade NAT), link-local (cloud metadata services live there:
/// 169.254.169.254, fd00:ec2::254), unique-local, multicast, unspecified, broadcast and reserved
/// ranges, and the IPv6 forms that embed an IPv4 address of those (mapped, compatible, NAT64, 6to4).
/// None for a public address.
pub fn forbidden_range(ip: IpAddr) -> Option<&'static str> {
    match ip {
        IpAddr::V4(v4) => forbidden_v4(v4),
        IpAddr::V6(v6) => forbidden_v6(v6),
    }
}

fn forbidden_v4(ip: Ipv4Addr) -> Option<&'static str> {
    let [a, b, c, _] = ip.octets();
    Some(match () {
        _ if a == 0 => "unspecified (0.0.0.0/8)",
        _ if ip.is_loopback() => "loopback",
        _ if ip.is_private() => "private",
        _ if a == 100 && (64..128).contains(&b) => "shared address space (100.64.0.0/10)",
        _ if ip.is_link_local() => "link-local, where metadata services answer",
        _ if a == 192 && b == 0 && c == 0 => "IETF protocol assignments (192.0.0.0/24)",
        _ if a == 198 && (b == 18 || b == 19) => "benchmarking (198.18.0.0/15)",
        _ if ip.is_multicast() => "multicast",
        _ if a >= 240 => "reserved or broadcast (240.0.0.0/4)",
        _ => return None,
    })
}

fn forbidden_v6(ip: Ipv6Addr) -> Option<&'static str> {
    let s = ip.segments();
    // Forms that carry an IPv4 address: judged by that address.
    let embedded = |hi: u16, lo: u16| Ipv4Addr::new((hi >> 8) as u8, hi as u8, (lo >> 8) as u8, lo as u8);
    if let Some(v4) = ip.to_ipv4_mapped() {
        return forbidden_v4(v4).map(|_| "an IPv4-mapped form of a refused IPv4 address");
    }
    if s[..6] == [0; 6] && !ip.is_unspecified() && !ip.is_loopback() {
        // IPv4-compatible (::a.b.c.d, deprecated)
        return forbidden_v4(embedded(s[6], s[7])).map(|_| "an IPv4-compatible form of a refused IPv4 address");
    }
    if s[0] == 0x64 && s[1] == 0xff9b && s[2..6] == [0; 4] {
        return forbidden_v4(embedded(s[6], s[7])).map(|_| "a NAT64 form of a refused IPv4 address");
    }
    if s[0] == 0x2002 {
        return forbidden_v4(embedded(s[1], s[2])).map(|_| "a 6to4 form of a refused IPv4 address");
    }
    Some(match () {
        _ if ip.is_unspecified() => "unspecified",
        _ if ip.is_loopback() => "loopback",
        _ if (s[0] & 0xfe00) == 0xfc00 => "unique-local (fc00::/7), where metadata services answer",
        _ if (s[0] & 0xffc0) == 0xfe80 => "link-local (fe80::/10)",
        _ if (s[0] & 0xffc0) == 0xfec0 => "site-local (fec0::/10)",
        _ if ip.is_multicast() => "multicast",
        _ if s[0] == 0x100 && s[1..4] == [0; 3] => "discard-only (100::/64)",
        _ => return None,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ip(s: &str) -> IpAddr {
        s.parse().unwrap()
    }

    #[test]
    fn every_refused_range_is_refused_and_public_addresses_pass() {
        let refused = [
            "0.0.0.0",
            "0.1.2.3",
            "127.0.0.1",
            "127.255.255.254",
            "10.0.0.1",
            "10.255.255.255",
            "172.16.0.1",
            "172.31.255.255",
            "192.168.1.1",
            "100.64.0.1",
            "100.127.255.255",
            "169.254.169.254",
            "169.254.0.1",
            "192.0.0.8",
            "198.18.0.1",
            "224.0.0.1",
            "239.255.255.250",
            "240.0.0.1",
            "255.255.255.255",
            "::",
            "::1",
            "fc00::1",
            "fd00:ec2::254",
            "fe80::1",
            "febf::1",
            "fec0::1",
            "ff02::1",
            "100::1",
            "::ffff:127.0.0.1",
            "::ffff:10.1.2.3",
            "::ffff:169.254.169.254",
            "::ffff:0.0.0.0",
            "::127.0.0.1",
            "::10.0.0.1",
            "64:ff9b::a9fe:a9fe",
            "64:ff9b::7f00:1",
            "2002:7f00:1::",
            "2002:a00:1::1",
        ];
        for a in refused {
            assert!(forbidden_range(ip(a)).is_some(), "{a} must be refused");
        }
        let public = [
            "8.8.8.8",
            "1.1.1.1",
            "172.32.0.1",
            "172.15.255.255",
            "100.128.0.1",
            "169.255.0.1",
            "192.0.2.1",
            "2606:4700::1111",
            "2001:4860:4860::8888",
            "::ffff:8.8.8.8",
            "64:ff9b::808:808",
            "2002:808:808::1",
        ];
        for a in public {
            assert_eq!(forbidden_range(ip(a)), None, "{a} is public");
        }
    }

    #[test]
    fn host_rules_parse_names_ips_and_ports() {
        let r = |s: &str| HostRule::parse(s).unwrap();
        assert_eq!(r("Data.Example.org"), HostRule { host: RuleHost::Name("data.example.org".into()), port: None });
        assert_eq!(r("data.example.org:8443"), HostRule { host: RuleHost::Name("data.example.org".into()), port: Some(8443) });
        assert_eq!(r("10.0.0.7"), HostRule { host: RuleHost::Ip(ip("10.0.0.7")), port: None });
        assert_eq!(r("10.0.0.7:443"), HostRule { host: RuleHost::Ip(ip("10.0.0.7")), port: Some(443) });
        assert_eq!(r("::1"), HostRule { host: RuleHost::Ip(ip("::1")), port: None });
        assert_eq!(r("[::1]:8443"), HostRule { host: RuleHost::Ip(ip("::1")), port: Some(8443) });
        assert_eq!(r("[::1]"), HostRule { host: RuleHost::Ip(ip("::1")), port: None });
        for bad in ["", "a b", "host:port", "[::1", "[x]:1", "a..b", "http://a", "a/b", "h:99999"] {
            assert!(HostRule::parse(bad).is_err(), "{bad:?} must not parse");
        }
    }

    #[test]
    fn names_need_an_entry_and_private_addresses_need_their_literal() {
        let lists =
            AllowLists::new(&["cubes".into()], &["data.example.org".into(), "lab.example.org:8443".into(), "10.0.0.7:8443".into(), "[::1]:9000".into()])
                .unwrap();
        assert!(lists.check_bucket("cubes").is_ok());
        assert!(matches!(lists.check_bucket("other"), Err(RefError::Forbidden(_))));
        let name = |n: &str| UrlHost::Name(n.into());
        assert!(lists.check_host(&name("data.example.org"), 443).is_ok());
        assert!(lists.check_host(&name("data.example.org"), 8080).is_ok());
        assert!(lists.check_host(&name("lab.example.org"), 8443).is_ok());
        assert!(lists.check_host(&name("lab.example.org"), 443).is_err());
        assert!(lists.check_host(&name("evil.example.org"), 443).is_err());
        assert!(lists.check_host(&UrlHost::Ip(ip("10.0.0.7")), 8443).is_ok());
        assert!(lists.check_host(&UrlHost::Ip(ip("10.0.0.8")), 8443).is_err());
        // A public address passes; one refused address among several refuses the name.
        assert_eq!(lists.check_addresses("data.example.org", 443, &[ip("93.184.216.34")]).unwrap(), ip("93.184.216.34"));
        for a in ["127.0.0.1", "10.1.2.3", "169.254.169.254", "::1", "::ffff:127.0.0.1", "fd00:ec2::254"] {
            let e = lists.check_addresses("data.example.org", 443, &[ip("93.184.216.34"), ip(a)]).unwrap_err();
            assert!(matches!(e, RefError::Forbidden(_)), "{a}");
        }
        // Allow-listed literally (with its port): a name resolving to it passes, also in mapped form.
        assert!(lists.check_addresses("lab.example.org", 8443, &[ip("10.0.0.7")]).is_ok());
        assert!(lists.check_addresses("lab.example.org", 8443, &[ip("::ffff:10.0.0.7")]).is_ok());
        assert!(lists.check_addresses("lab.example.org", 443, &[ip("10.0.0.7")]).is_err());
        assert!(lists.check_addresses("x", 9000, &[ip("::1")]).is_ok());
        assert!(lists.check_addresses("x", 9000, &[]).is_err());
        assert!(AllowLists::new(&["a/b".into()], &[]).is_err());
    }
}
