package roomserver

import (
	"fmt"
	"testing"
)

// What a device was sent counts from the answer that carried it on, per
// room and device, and the memory stays bounded: a device over its bound
// forgets all it was sent, and a new device over the bound of devices
// pushes another out (both are sent their members again).
func TestLazySentMemory(t *testing.T) {
	var l lazySent
	k := lazyKey{"@a:x", "D"}
	l.remember(k, "!r:x", map[string]string{"@b:x": "$b1"}, 10)
	switch {
	case !l.sent(k, "!r:x", "@b:x", "$b1", 10), !l.sent(k, "!r:x", "@b:x", "$b1", 12):
		t.Fatal("a member sent at 10 is not known from 10 on")
	case l.sent(k, "!r:x", "@b:x", "$b1", 9):
		t.Fatal("a sync from before the answer that carried it counts it as sent")
	case l.sent(k, "!r:x", "@b:x", "$b2", 12):
		t.Fatal("another member event of the same user counts as sent")
	case l.sent(k, "!other:x", "@b:x", "$b1", 12), l.sent(lazyKey{"@a:x", "E"}, "!r:x", "@b:x", "$b1", 12):
		t.Fatal("sent in another room, or to another device")
	}
	l.forget(k, "!r:x")
	if l.sent(k, "!r:x", "@b:x", "$b1", 12) || l.count[k] != 0 {
		t.Fatalf("forgotten, yet known (count %d)", l.count[k])
	}

	members := map[string]string{}
	for i := range maxLazyMembers {
		members[fmt.Sprint("@u", i, ":x")] = "$e"
	}
	l.remember(k, "!r:x", members, 20)
	if l.count[k] != maxLazyMembers {
		t.Fatalf("count %d", l.count[k])
	}
	l.remember(k, "!s:x", map[string]string{"@b:x": "$b1"}, 21)
	if l.count[k] != 1 || l.sent(k, "!r:x", "@u1:x", "$e", 30) || !l.sent(k, "!s:x", "@b:x", "$b1", 30) {
		t.Fatalf("over the bound: count %d", l.count[k])
	}

	for i := range maxLazyDevices + 5 {
		l.remember(lazyKey{"@a:x", fmt.Sprint("D", i)}, "!r:x", map[string]string{"@b:x": "$b1"}, 1)
	}
	if len(l.devices) > maxLazyDevices || len(l.count) != len(l.devices) {
		t.Fatalf("%d devices remembered (%d counts)", len(l.devices), len(l.count))
	}
}
