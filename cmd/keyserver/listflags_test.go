package main

import (
	"io"
	"reflect"
	"testing"
)

// List settings are flags too, written as comma-separated values.
func TestListFlags(t *testing.T) {
	cfg, _, err := loadConfig([]string{"--federation-ip-range-allowlist", "127.0.0.0/8,::1"}, io.Discard, io.Discard, "")
	if err != nil {
		t.Fatal(err)
	}
	if want := []string{"127.0.0.0/8", "::1"}; !reflect.DeepEqual(cfg.Federation.IPRangeAllowlist, want) {
		t.Errorf("allowlist %q, want %q", cfg.Federation.IPRangeAllowlist, want)
	}
	if _, _, err := loadConfig([]string{"--federation-ip-range-allowlist", "127.0.0.0/8,nonsense"}, io.Discard, io.Discard, ""); err == nil {
		t.Error("a bad range on the command line was accepted")
	}
}
