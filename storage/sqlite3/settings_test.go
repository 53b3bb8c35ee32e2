package sqlite3

import (
	"path/filepath"
	"testing"
)

// The write connection runs with the settings the store relies on.
func TestWriteConnectionSettings(t *testing.T) {
	d, err := Open(filepath.Join(t.TempDir(), "keys.db"))
	if err != nil {
		t.Fatal(err)
	}
	defer d.Close()
	for pragma, want := range map[string]string{
		"journal_mode":       "wal",
		"synchronous":        "1", // NORMAL
		"foreign_keys":       "1",
		"wal_autocheckpoint": "0", // the checkpointer's job
		"temp_store":         "2", // MEMORY: statement journals never go to a file
	} {
		var got string
		if err := d.Write.QueryRow("PRAGMA " + pragma).Scan(&got); err != nil {
			t.Fatal(err)
		}
		if got != want {
			t.Errorf("%s = %s, want %s", pragma, got, want)
		}
	}
}
