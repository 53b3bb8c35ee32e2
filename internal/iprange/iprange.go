// Package iprange matches IP addresses against lists of ranges written as
// CIDRs or single addresses, as configuration files give them: the
// outbound denylist and allowlist, and the trusted reverse proxies.
package iprange

import (
	"fmt"
	"net/netip"
	"strings"
)

// NonPublic are the ranges no other Matrix server should be reached at:
// loopback, private, carrier-grade NAT, link-local, unique-local,
// documentation and test networks, multicast and reserved space. It is
// Synapse's default ip_range_blacklist plus the unspecified addresses and
// 240.0.0.0/4. IPv4-mapped IPv6 addresses are matched as IPv4.
var NonPublic = []string{
	"0.0.0.0/8",
	"10.0.0.0/8",
	"100.64.0.0/10",
	"127.0.0.0/8",
	"169.254.0.0/16",
	"172.16.0.0/12",
	"192.0.0.0/24",
	"192.0.2.0/24",
	"192.88.99.0/24",
	"192.168.0.0/16",
	"198.18.0.0/15",
	"198.51.100.0/24",
	"203.0.113.0/24",
	"224.0.0.0/4",
	"240.0.0.0/4",
	"::/128",
	"::1/128",
	"2001:db8::/32",
	"fc00::/7",
	"fe80::/10",
	"fec0::/10",
	"ff00::/8",
}

// Set is a list of ranges. The zero value matches nothing.
type Set []netip.Prefix

// Parse reads ranges written as CIDRs ("10.0.0.0/8", "fd00::/8") or
// single addresses ("192.0.2.1"). It names every entry it cannot read.
func Parse(entries []string) (Set, error) {
	var s Set
	var bad []string
	for _, e := range entries {
		p, err := parseOne(strings.TrimSpace(e))
		if err != nil {
			bad = append(bad, fmt.Sprintf("%q", e))
			continue
		}
		s = append(s, p)
	}
	if len(bad) > 0 {
		return nil, fmt.Errorf("not an IP address or CIDR range: %s", strings.Join(bad, ", "))
	}
	return s, nil
}

// MustParse is Parse for lists known to be valid.
func MustParse(entries []string) Set {
	s, err := Parse(entries)
	if err != nil {
		panic(err)
	}
	return s
}

func parseOne(e string) (netip.Prefix, error) {
	if strings.Contains(e, "/") {
		p, err := netip.ParsePrefix(e)
		if err != nil {
			return netip.Prefix{}, err
		}
		if p.Addr().Is4In6() {
			// "::ffff:10.0.0.0/104" means the IPv4 range: addresses are
			// unmapped before matching.
			if p.Bits() < 96 {
				return netip.Prefix{}, fmt.Errorf("mapped range shorter than /96")
			}
			p = netip.PrefixFrom(p.Addr().Unmap(), p.Bits()-96)
		}
		return p.Masked(), nil
	}
	a, err := netip.ParseAddr(e)
	if err != nil {
		return netip.Prefix{}, err
	}
	a = a.Unmap()
	return netip.PrefixFrom(a, a.BitLen()), nil
}

// Contains reports whether a is in one of the ranges. An IPv4-mapped IPv6
// address (::ffff:127.0.0.1) counts as its IPv4 address, and an IPv6 zone
// is ignored.
func (s Set) Contains(a netip.Addr) bool {
	a = a.Unmap().WithZone("")
	for _, p := range s {
		if p.Contains(a) {
			return true
		}
	}
	return false
}

// ContainsString is Contains for an address in text form ("127.0.0.1",
// "::1", "[::1]" or with a port: "127.0.0.1:8448"); text that is no
// address is in no range.
func (s Set) ContainsString(addr string) bool {
	a, ok := ParseAddr(addr)
	return ok && s.Contains(a)
}

// ParseAddr reads an address with or without a port or brackets, as
// net/http's RemoteAddr and X-Forwarded-For entries write them.
func ParseAddr(addr string) (netip.Addr, bool) {
	addr = strings.TrimSpace(addr)
	if ap, err := netip.ParseAddrPort(addr); err == nil {
		return ap.Addr().Unmap(), true
	}
	addr = strings.TrimSuffix(strings.TrimPrefix(addr, "["), "]")
	a, err := netip.ParseAddr(addr)
	if err != nil {
		return netip.Addr{}, false
	}
	return a.Unmap(), true
}
