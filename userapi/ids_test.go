package userapi

import (
	"strings"
	"testing"
)

func TestIDs(t *testing.T) {
	for _, s := range []string{"alice", "a.b_c=d-e/f+g", "0"} {
		if !validLocalpart(s) {
			t.Errorf("localpart %q rejected", s)
		}
	}
	for _, s := range []string{"", "Alice", "a b", "a:b", "é", "a@b"} {
		if validLocalpart(s) {
			t.Errorf("localpart %q accepted", s)
		}
	}
	for _, s := range []string{"ABCDEFGHIJ", "dev-1.x_y~z", strings.Repeat("A", 255)} {
		if !validDeviceID(s) {
			t.Errorf("device ID %q rejected", s)
		}
	}
	for _, s := range []string{"", "a b", "a/b", "a:b", strings.Repeat("A", 256)} {
		if validDeviceID(s) {
			t.Errorf("device ID %q accepted", s)
		}
	}
	id := newDeviceID()
	if len(id) != 10 || strings.ToUpper(id) != id || !validDeviceID(id) {
		t.Errorf("generated device ID %q", id)
	}
	if a, b := newAccessToken(), newAccessToken(); a == b || len(a) < 40 {
		t.Errorf("tokens %q %q", a, b)
	}
}
