package iprange

import (
	"net/netip"
	"testing"
)

func TestNonPublic(t *testing.T) {
	s := MustParse(NonPublic)
	for _, a := range []string{
		"127.0.0.1", "127.1.2.3", "10.1.2.3", "172.16.0.1", "172.31.255.255", "192.168.1.1",
		"100.64.0.1", "169.254.169.254", "0.0.0.0", "224.0.0.1", "255.255.255.255",
		"::1", "::", "fe80::1", "fd00::1", "fc00::1", "ff02::1", "2001:db8::1",
		"::ffff:127.0.0.1", "::ffff:10.0.0.1", "::ffff:192.168.0.1",
	} {
		if !s.Contains(netip.MustParseAddr(a)) {
			t.Errorf("%s is not denied", a)
		}
	}
	for _, a := range []string{"1.1.1.1", "8.8.8.8", "172.32.0.1", "2606:4700::1111", "::ffff:1.1.1.1", "192.169.0.1"} {
		if s.Contains(netip.MustParseAddr(a)) {
			t.Errorf("public address %s is denied", a)
		}
	}
}

func TestParse(t *testing.T) {
	s, err := Parse([]string{"127.0.0.0/8", " 192.0.2.7 ", "::ffff:10.0.0.0/104", "fd00::/8"})
	if err != nil {
		t.Fatal(err)
	}
	for a, want := range map[string]bool{
		"127.0.0.2": true, "192.0.2.7": true, "192.0.2.8": false, "10.9.9.9": true,
		"::ffff:127.0.0.1": true, "fd12::1": true, "11.0.0.1": false,
	} {
		if got := s.Contains(netip.MustParseAddr(a)); got != want {
			t.Errorf("Contains(%s) = %v, want %v", a, got, want)
		}
	}
	if _, err := Parse([]string{"10.0.0.0/8", "nonsense", "10.0.0.0/33"}); err == nil ||
		err.Error() != `not an IP address or CIDR range: "nonsense", "10.0.0.0/33"` {
		t.Errorf("Parse of bad entries: %v", err)
	}
	var empty Set
	if empty.Contains(netip.MustParseAddr("127.0.0.1")) {
		t.Error("the empty set contains an address")
	}
}

func TestParseAddr(t *testing.T) {
	for in, want := range map[string]string{
		"127.0.0.1": "127.0.0.1", "127.0.0.1:8008": "127.0.0.1", "[::1]:80": "::1", "[::1]": "::1",
		"::ffff:127.0.0.1": "127.0.0.1", " 192.0.2.1 ": "192.0.2.1",
	} {
		a, ok := ParseAddr(in)
		if !ok || a.String() != want {
			t.Errorf("ParseAddr(%q) = %v, %v; want %s", in, a, ok, want)
		}
	}
	for _, in := range []string{"", "unknown", "example.org:80", "1.2.3"} {
		if _, ok := ParseAddr(in); ok {
			t.Errorf("ParseAddr(%q) succeeded", in)
		}
	}
}
