package sqlstore

import (
	"fmt"
	"strings"
	"testing"
)

func TestNotifyPayload(t *testing.T) {
	many := func(prefix string, n int) []string {
		var l []string
		for i := range n {
			l = append(l, fmt.Sprintf("@%s%05d:x", prefix, i)) // 9 bytes
		}
		return l
	}
	for _, c := range []struct {
		name  string
		lists [][]string
		want  string
	}{
		{"nobody", nil, "u:"},
		{"one list, as it is", [][]string{{"@b:x", "@a:x"}}, "u:@b:x\n@a:x"},
		{"a user in every list", [][]string{{"@a:x", "@c:x"}, {"@b:x", "@c:x"}, {"@c:x", "@d:x"}}, "u:@a:x\n@b:x\n@c:x\n@d:x"},
		{"lists merged, each user once", [][]string{{"@a:x", "@b:x"}, {"@a:x", "@c:x"}, {"@0:x", "@b:x", "@d:x"}}, "u:@0:x\n@a:x\n@b:x\n@c:x\n@d:x"},
		// 7,900 bytes at most: "u:", 788 users of 9 bytes and one of 18,
		// 788 separators.
		{"at the limit", [][]string{many("a", 788), {"@zzzzzzzzzzzzzzz:x"}}, "u:" + strings.Join(append(many("a", 788), "@zzzzzzzzzzzzzzz:x"), "\n")},
		{"a byte over", [][]string{many("a", 788), {"@zzzzzzzzzzzzzzzz:x"}}, ""},
		{"one list too long", [][]string{many("a", 800), {"@b:x"}}, ""},
		{"too long merged", [][]string{many("a", 500), many("b", 500)}, ""},
		{"short once merged", [][]string{many("a", 500), many("a", 500)}, "u:" + strings.Join(many("a", 500), "\n")},
	} {
		if got := notifyPayload(c.lists...); got != c.want {
			t.Errorf("%s: payload of %d bytes %.40q, want %d bytes %.40q", c.name, len(got), got, len(c.want), c.want)
		}
	}
}
