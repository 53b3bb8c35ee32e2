package main

import (
	"io"
	"os"
	"path/filepath"
	"testing"
)

// keys.strict_validation is true unless the file or its flag,
// --keys-strict-validation, turns it off; the flag wins over the file.
func TestKeysStrictValidationSetting(t *testing.T) {
	dir := t.TempDir()
	lax := filepath.Join(dir, "lax.yaml")
	if err := os.WriteFile(lax, []byte("keys:\n  strict_validation: false\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		args []string
		want bool
	}{
		{nil, true},
		{[]string{"--keys-strict-validation=false"}, false},
		{[]string{"--config", lax}, false},
		{[]string{"--config", lax, "--keys-strict-validation"}, true},
	} {
		cfg, _, err := loadConfig(tc.args, io.Discard, io.Discard, "test")
		if err != nil {
			t.Fatalf("%q: %v", tc.args, err)
		}
		if cfg.Keys.StrictValidation != tc.want {
			t.Errorf("%q: strict_validation %v, want %v", tc.args, cfg.Keys.StrictValidation, tc.want)
		}
	}
}
