//! Which IP addresses a webhook may be delivered to: those of the public
//! internet, decided from IANA's registries as a whole rather than a list
//! of the ranges someone remembered.
//!
//! - [`IPV4`] is the IANA IPv4 Special-Purpose Address Registry
//!   (iana-ipv4-special-registry, RFC 6890 and its updates), every entry,
//!   plus the multicast block of the IPv4 Multicast Address Space registry
//!   (RFC 5771);
//! - [`IPV6`] is the IANA IPv6 Special-Purpose Address Registry
//!   (iana-ipv6-special-registry, its entries up to RFC 9780's of 2025),
//!   every entry, plus multicast (RFC 4291); and an IPv6 address outside
//!   the global unicast space 2000::/3 (IANA IPv6 Address Space registry:
//!   the rest is reserved by the IETF, or deprecated like fec0::/10) is
//!   not public either.
//!
//! An address in any block is refused, whatever the registry's "globally
//! reachable" column says: the blocks marked reachable are anycast services
//! of the network itself (AS112, PCP, TURN, AMT), never a webhook receiver,
//! and the blocks that embed an IPv4 address (IPv4-mapped, NAT64, 6to4,
//! Teredo) would otherwise carry a private one past the filter.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

/// A registry entry: first address, prefix length, name, defining RFC.
pub type Block<A> = (A, u8, &'static str, &'static str);

const fn v4(a: u8, b: u8, c: u8, d: u8) -> Ipv4Addr {
    Ipv4Addr::new(a, b, c, d)
}

#[allow(clippy::too_many_arguments)]
const fn v6(a: u16, b: u16, c: u16, d: u16, e: u16, f: u16, g: u16, h: u16) -> Ipv6Addr {
    Ipv6Addr::new(a, b, c, d, e, f, g, h)
}

pub const IPV4: [Block<Ipv4Addr>; 26] = [
    (v4(0, 0, 0, 0), 8, "\"This network\"", "RFC 791"),
    (v4(0, 0, 0, 0), 32, "\"This host on this network\"", "RFC 1122"),
    (v4(10, 0, 0, 0), 8, "Private-Use", "RFC 1918"),
    (v4(100, 64, 0, 0), 10, "Shared Address Space", "RFC 6598"),
    (v4(127, 0, 0, 0), 8, "Loopback", "RFC 1122"),
    (v4(169, 254, 0, 0), 16, "Link Local", "RFC 3927"),
    (v4(172, 16, 0, 0), 12, "Private-Use", "RFC 1918"),
    (v4(192, 0, 0, 0), 24, "IETF Protocol Assignments", "RFC 6890"),
    (v4(192, 0, 0, 0), 29, "IPv4 Service Continuity Prefix", "RFC 7335"),
    (v4(192, 0, 0, 8), 32, "IPv4 dummy address", "RFC 7600"),
    (v4(192, 0, 0, 9), 32, "Port Control Protocol Anycast", "RFC 7723"),
    (
        v4(192, 0, 0, 10),
        32,
        "Traversal Using Relays around NAT Anycast",
        "RFC 8155",
    ),
    (v4(192, 0, 0, 170), 32, "NAT64/DNS64 Discovery", "RFC 7050"),
    (v4(192, 0, 0, 171), 32, "NAT64/DNS64 Discovery", "RFC 7050"),
    (v4(192, 0, 2, 0), 24, "Documentation (TEST-NET-1)", "RFC 5737"),
    (v4(192, 31, 196, 0), 24, "AS112-v4", "RFC 7535"),
    (v4(192, 52, 193, 0), 24, "AMT", "RFC 7450"),
    (
        v4(192, 88, 99, 0),
        24,
        "Deprecated (6to4 Relay Anycast)",
        "RFC 7526",
    ),
    (v4(192, 168, 0, 0), 16, "Private-Use", "RFC 1918"),
    (
        v4(192, 175, 48, 0),
        24,
        "Direct Delegation AS112 Service",
        "RFC 7534",
    ),
    (v4(198, 18, 0, 0), 15, "Benchmarking", "RFC 2544"),
    (v4(198, 51, 100, 0), 24, "Documentation (TEST-NET-2)", "RFC 5737"),
    (v4(203, 0, 113, 0), 24, "Documentation (TEST-NET-3)", "RFC 5737"),
    (v4(240, 0, 0, 0), 4, "Reserved", "RFC 1112"),
    (v4(255, 255, 255, 255), 32, "Limited Broadcast", "RFC 8190"),
    (v4(224, 0, 0, 0), 4, "Multicast", "RFC 5771"),
];

pub const IPV6: [Block<Ipv6Addr>; 28] = [
    (v6(0, 0, 0, 0, 0, 0, 0, 1), 128, "Loopback Address", "RFC 4291"),
    (v6(0, 0, 0, 0, 0, 0, 0, 0), 128, "Unspecified Address", "RFC 4291"),
    (
        v6(0, 0, 0, 0, 0, 0xffff, 0, 0),
        96,
        "IPv4-mapped Address",
        "RFC 4291",
    ),
    (
        v6(0x64, 0xff9b, 0, 0, 0, 0, 0, 0),
        96,
        "IPv4-IPv6 Translat.",
        "RFC 6052",
    ),
    (
        v6(0x64, 0xff9b, 1, 0, 0, 0, 0, 0),
        48,
        "IPv4-IPv6 Translat.",
        "RFC 8215",
    ),
    (
        v6(0x100, 0, 0, 0, 0, 0, 0, 0),
        64,
        "Discard-Only Address Block",
        "RFC 6666",
    ),
    (
        v6(0x100, 0, 0, 1, 0, 0, 0, 0),
        64,
        "Dummy IPv6 Prefix",
        "RFC 9780",
    ),
    (
        v6(0x2001, 0, 0, 0, 0, 0, 0, 0),
        23,
        "IETF Protocol Assignments",
        "RFC 2928",
    ),
    (v6(0x2001, 0, 0, 0, 0, 0, 0, 0), 32, "TEREDO", "RFC 4380"),
    (
        v6(0x2001, 1, 0, 0, 0, 0, 0, 1),
        128,
        "Port Control Protocol Anycast",
        "RFC 7723",
    ),
    (
        v6(0x2001, 1, 0, 0, 0, 0, 0, 2),
        128,
        "Traversal Using Relays around NAT Anycast",
        "RFC 8155",
    ),
    (
        v6(0x2001, 1, 0, 0, 0, 0, 0, 3),
        128,
        "DNS-SD Service Registration Protocol Anycast",
        "RFC 9665",
    ),
    (v6(0x2001, 2, 0, 0, 0, 0, 0, 0), 48, "Benchmarking", "RFC 5180"),
    (v6(0x2001, 3, 0, 0, 0, 0, 0, 0), 32, "AMT", "RFC 7450"),
    (v6(0x2001, 4, 0x112, 0, 0, 0, 0, 0), 48, "AS112-v6", "RFC 7535"),
    (
        v6(0x2001, 0x10, 0, 0, 0, 0, 0, 0),
        28,
        "Deprecated (previously ORCHID)",
        "RFC 4843",
    ),
    (v6(0x2001, 0x20, 0, 0, 0, 0, 0, 0), 28, "ORCHIDv2", "RFC 7343"),
    (
        v6(0x2001, 0x30, 0, 0, 0, 0, 0, 0),
        28,
        "Drone Remote ID Protocol Entity Tags",
        "RFC 9374",
    ),
    (
        v6(0x2001, 0xdb8, 0, 0, 0, 0, 0, 0),
        32,
        "Documentation",
        "RFC 3849",
    ),
    (v6(0x2002, 0, 0, 0, 0, 0, 0, 0), 16, "6to4", "RFC 3056"),
    (
        v6(0x2620, 0x4f, 0x8000, 0, 0, 0, 0, 0),
        48,
        "Direct Delegation AS112 Service",
        "RFC 7534",
    ),
    (v6(0x3fff, 0, 0, 0, 0, 0, 0, 0), 20, "Documentation", "RFC 9637"),
    (
        v6(0x5f00, 0, 0, 0, 0, 0, 0, 0),
        16,
        "Segment Routing (SRv6) SIDs",
        "RFC 9602",
    ),
    (v6(0xfc00, 0, 0, 0, 0, 0, 0, 0), 7, "Unique-Local", "RFC 4193"),
    (
        v6(0xfe80, 0, 0, 0, 0, 0, 0, 0),
        10,
        "Link-Local Unicast",
        "RFC 4291",
    ),
    (
        v6(0xfec0, 0, 0, 0, 0, 0, 0, 0),
        10,
        "Deprecated site-local",
        "RFC 3879",
    ),
    (v6(0xff00, 0, 0, 0, 0, 0, 0, 0), 8, "Multicast", "RFC 4291"),
    (
        v6(0, 0, 0, 0, 0, 0, 0, 0),
        96,
        "Deprecated IPv4-compatible",
        "RFC 4291",
    ),
];

fn in_v4(ip: Ipv4Addr, (net, len, ..): &Block<Ipv4Addr>) -> bool {
    let mask = u32::MAX.checked_shl(32 - u32::from(*len)).unwrap_or(0);
    u32::from(ip) & mask == u32::from(*net) & mask
}

fn in_v6(ip: Ipv6Addr, (net, len, ..): &Block<Ipv6Addr>) -> bool {
    let mask = u128::MAX.checked_shl(128 - u32::from(*len)).unwrap_or(0);
    u128::from(ip) & mask == u128::from(*net) & mask
}

/// The special-purpose block `ip` is in (its name and RFC), if any; for an
/// IPv6 address outside the global unicast space, that.
pub fn special(ip: IpAddr) -> Option<(&'static str, &'static str)> {
    match ip {
        IpAddr::V4(v4) => IPV4.iter().find(|b| in_v4(v4, b)).map(|b| (b.2, b.3)),
        IpAddr::V6(v6) => IPV6
            .iter()
            .find(|b| in_v6(v6, b))
            .map(|b| (b.2, b.3))
            .or_else(|| {
                (v6.segments()[0] & 0xe000 != 0x2000).then_some(("Reserved by the IETF", "RFC 4291"))
            }),
    }
}

/// Whether `ip` is an address of the public internet (in no block above).
pub fn is_public(ip: IpAddr) -> bool {
    special(ip).is_none()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn last_v4((net, len, ..): &Block<Ipv4Addr>) -> Ipv4Addr {
        Ipv4Addr::from(u32::from(*net) | u32::MAX.checked_shr(u32::from(*len)).unwrap_or(0))
    }

    fn last_v6((net, len, ..): &Block<Ipv6Addr>) -> Ipv6Addr {
        Ipv6Addr::from(u128::from(*net) | u128::MAX.checked_shr(u32::from(*len)).unwrap_or(0))
    }

    #[test]
    fn the_first_and_last_address_of_every_block_is_refused() {
        for b in &IPV4 {
            for ip in [b.0, last_v4(b)] {
                assert!(!is_public(ip.into()), "{ip} ({})", b.2);
            }
        }
        for b in &IPV6 {
            for ip in [b.0, last_v6(b)] {
                assert!(!is_public(ip.into()), "{ip} ({})", b.2);
            }
        }
    }

    #[test]
    fn the_ranges_a_review_found_missing_are_refused() {
        for ip in [
            "198.18.0.1",
            "198.19.255.254",
            "192.88.99.1",
            "2002:c0a8:101::1",                     // 6to4 of 192.168.1.1
            "2002:7f00:1::1",                       // 6to4 of 127.0.0.1
            "2001:0:4136:e378:8000:63bf:3fff:fdd2", // Teredo
            "::ffff:8.8.8.8",                       // IPv4-mapped: refused as a whole
            "::127.0.0.1",                          // IPv4-compatible
            "fec0::1",
            "4000::1",
            "3fff:fff::1",
        ] {
            let ip: IpAddr = ip.parse().unwrap();
            assert!(!is_public(ip), "{ip}");
        }
    }

    #[test]
    fn addresses_just_outside_the_blocks_are_public() {
        for ip in [
            "1.1.1.1",
            "9.255.255.255",
            "11.0.0.0",
            "100.63.255.255",
            "100.128.0.0",
            "172.15.255.255",
            "172.32.0.0",
            "192.0.1.255",
            "192.88.98.255",
            "198.17.255.255",
            "198.20.0.0",
            "223.255.255.255",
            "2606:4700:4700::1111",
            "2001:200::1",
            "2001:db7:ffff::1",
            "2003::1",
            "3fff:1000::1",
        ] {
            let ip: IpAddr = ip.parse().unwrap();
            assert!(is_public(ip), "{ip}: {:?}", special(ip));
        }
    }
}
