package main

import (
	"os"
	"path/filepath"
	"strconv"
	"testing"
	"time"
)

func TestParseStat(t *testing.T) {
	// A command name with spaces and parentheses, as a process may set.
	st, err := parseStat("4242 (post gres: (x) idle) S 17 4242 4242 0 -1 4194560 1 0 0 0 250 70 9 3 20 0 1 0 100 0 0\n")
	if err != nil {
		t.Fatal(err)
	}
	if st != (procStat{ppid: 17, utime: 250, stime: 70, cutime: 9, cstime: 3}) {
		t.Fatalf("got %+v", st)
	}
	if _, err := parseStat("12 (x) S 1 2"); err == nil {
		t.Fatal("short line accepted")
	}
}

func writeStat(t *testing.T, root string, pid, ppid int, utime, stime, cutime, cstime int) {
	t.Helper()
	dir := filepath.Join(root, strconv.Itoa(pid))
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	line := strconv.Itoa(pid) + " (postgres) S " + strconv.Itoa(ppid) + " 0 0 0 -1 0 0 0 0 0 " +
		strconv.Itoa(utime) + " " + strconv.Itoa(stime) + " " + strconv.Itoa(cutime) + " " + strconv.Itoa(cstime) + " 20 0 1 0\n"
	if err := os.WriteFile(filepath.Join(dir, "stat"), []byte(line), 0o644); err != nil {
		t.Fatal(err)
	}
}

// PostgreSQL's CPU is its postmaster's with that of its ended children,
// plus its live children's; other processes do not count.
func TestPostgresCPU(t *testing.T) {
	root := t.TempDir()
	old := procRoot
	procRoot = root
	t.Cleanup(func() { procRoot = old })
	writeStat(t, root, 100, 1, 10, 5, 40, 2)                                      // postmaster
	writeStat(t, root, 101, 100, 300, 100, 0, 0)                                  // a backend
	writeStat(t, root, 102, 100, 7, 3, 0, 0)                                      // checkpointer
	writeStat(t, root, 200, 1, 999, 999, 0, 0)                                    // the daemon, not PostgreSQL's
	writeStat(t, root, 201, 101, 50, 50, 0, 0)                                    // a grandchild: not PostgreSQL's
	if err := os.WriteFile(filepath.Join(root, "self"), nil, 0o644); err != nil { // not a PID
		t.Fatal(err)
	}
	data := t.TempDir()
	if err := os.WriteFile(filepath.Join(data, "postmaster.pid"), []byte("100\n/data\n1700000000\n5432\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	got, err := postgresCPU(data)
	if err != nil {
		t.Fatal(err)
	}
	if want := (10 + 5 + 40 + 2 + 300 + 100 + 7 + 3) * clockTick; got != want {
		t.Fatalf("got %s, want %s", got, want)
	}
	daemons, err := processesCPU([]int{200, 102})
	if err != nil || daemons != (999+999+7+3)*clockTick {
		t.Fatalf("got %s %v", daemons, err)
	}
	if _, err := processesCPU([]int{999}); err == nil {
		t.Fatal("a process that does not exist was read")
	}
}

// The tool's own process, after spending CPU, reads as having spent it.
func TestOwnCPU(t *testing.T) {
	before, err := processesCPU([]int{os.Getpid()})
	if err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(10 * time.Second)
	for {
		x := 0
		for i := 0; i < 1_000_000; i++ {
			x += i * i
		}
		_ = x
		after, err := processesCPU([]int{os.Getpid()})
		if err != nil {
			t.Fatal(err)
		}
		if after >= before+50*time.Millisecond {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("CPU time went from %s to %s over a busy loop", before, after)
		}
	}
}
