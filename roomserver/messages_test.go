package roomserver

import "testing"

func TestTypeMatches(t *testing.T) {
	for _, c := range []struct {
		pattern, evType string
		want            bool
	}{
		{"m.room.message", "m.room.message", true},
		{"m.room.message", "m.room.messages", false},
		{"m.room.*", "m.room.member", true},
		{"m.room.*", "m.room.", true},
		{"m.room.*", "m.roo", false},
		{"*", "anything", true},
		{"*.member", "m.room.member", true},
		{"*.member", "m.room.members", false},
		{"m.*.member", "m.room.member", true},
		{"m.*.member", "m.member", false},
		{"a*b*b", "ab", false},
		{"a*b*b", "abb", true},
		{"a*b*c", "axxbyyc", true},
	} {
		if got := typeMatches(c.pattern, c.evType); got != c.want {
			t.Errorf("typeMatches(%q, %q) = %v, want %v", c.pattern, c.evType, got, c.want)
		}
	}
}
