package main

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"
)

// procRoot is where the process table is read; tests point it elsewhere.
var procRoot = "/proc"

// clockTick is the unit of the times in /proc/PID/stat (USER_HZ), which
// Linux fixes at 100 per second for every program whatever the kernel's
// own tick rate.
const clockTick = 10 * time.Millisecond

// procStat holds the fields of /proc/PID/stat the tool reads.
type procStat struct {
	ppid                         int
	utime, stime, cutime, cstime int64 // clock ticks
}

func readStat(pid int) (procStat, error) {
	raw, err := os.ReadFile(filepath.Join(procRoot, strconv.Itoa(pid), "stat"))
	if err != nil {
		return procStat{}, err
	}
	return parseStat(string(raw))
}

// parseStat reads a /proc/PID/stat line. The command name in parentheses
// may hold spaces and parentheses itself, so fields are counted from the
// last ')'.
func parseStat(line string) (procStat, error) {
	i := strings.LastIndexByte(line, ')')
	if i < 0 {
		return procStat{}, errors.New("malformed stat line")
	}
	f := strings.Fields(line[i+1:])
	// f[0] is field 3 (state): ppid is field 4, utime..cstime fields 14-17.
	if len(f) < 15 {
		return procStat{}, errors.New("short stat line")
	}
	var st procStat
	var err error
	num := func(s string) int64 {
		n, e := strconv.ParseInt(s, 10, 64)
		if e != nil && err == nil {
			err = fmt.Errorf("stat field %q: %w", s, e)
		}
		return n
	}
	st.ppid = int(num(f[1]))
	st.utime, st.stime, st.cutime, st.cstime = num(f[11]), num(f[12]), num(f[13]), num(f[14])
	return st, err
}

// processesCPU is the CPU time the processes have spent so far.
func processesCPU(pids []int) (time.Duration, error) {
	var ticks int64
	for _, pid := range pids {
		st, err := readStat(pid)
		if err != nil {
			return 0, err
		}
		ticks += st.utime + st.stime
	}
	return time.Duration(ticks) * clockTick, nil
}

// postgresCPU is the CPU time a PostgreSQL cluster has spent so far: its
// postmaster (whose PID is the first line of postmaster.pid in the data
// directory), the children alive now (backends, WAL writer, checkpointer,
// ...), and the children that have ended, which the kernel adds to the
// postmaster's cutime and cstime when it reaps them.
func postgresCPU(dataDir string) (time.Duration, error) {
	raw, err := os.ReadFile(filepath.Join(dataDir, "postmaster.pid"))
	if err != nil {
		return 0, err
	}
	first, _, _ := strings.Cut(string(raw), "\n")
	postmaster, err := strconv.Atoi(strings.TrimSpace(first))
	if err != nil {
		return 0, fmt.Errorf("postmaster.pid: %w", err)
	}
	st, err := readStat(postmaster)
	if err != nil {
		return 0, err
	}
	ticks := st.utime + st.stime + st.cutime + st.cstime
	entries, err := os.ReadDir(procRoot)
	if err != nil {
		return 0, err
	}
	for _, e := range entries {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		child, err := readStat(pid)
		if err != nil || child.ppid != postmaster {
			continue // not a process, or one that ended since the listing
		}
		ticks += child.utime + child.stime
	}
	return time.Duration(ticks) * clockTick, nil
}

// cpuMeter reads the CPU time of what the tool measures, the daemons and
// the local PostgreSQL, each when the tool was told where they are, and
// the tool's own: on one machine, what the tool spends the daemons lack.
type cpuMeter struct {
	pids         []int
	postgresData string
}

// cpuSample is one reading; a negative time was not measured.
type cpuSample struct{ daemons, postgres, tool time.Duration }

func (m cpuMeter) read() (cpuSample, error) {
	s := cpuSample{daemons: -1, postgres: -1}
	var err error
	if s.tool, err = processesCPU([]int{os.Getpid()}); err != nil {
		return s, fmt.Errorf("the tool's CPU: %w", err)
	}
	if len(m.pids) > 0 {
		if s.daemons, err = processesCPU(m.pids); err != nil {
			return s, fmt.Errorf("daemon CPU: %w", err)
		}
	}
	if m.postgresData != "" {
		if s.postgres, err = postgresCPU(m.postgresData); err != nil {
			return s, fmt.Errorf("PostgreSQL CPU: %w", err)
		}
	}
	return s, nil
}

// perRequest is the CPU time between two readings per request, in µs; -1
// when not measured.
func perRequest(before, after time.Duration, requests int) float64 {
	if before < 0 || after < 0 || requests == 0 {
		return -1
	}
	return float64(after-before) / float64(time.Microsecond) / float64(requests)
}

// parseTargets reads the -url and -pid lists.
func parseTargets(urls, pids string) ([]string, []int, error) {
	var us []string
	for _, u := range strings.Split(urls, ",") {
		if u = strings.TrimSpace(u); u != "" {
			us = append(us, u)
		}
	}
	if len(us) == 0 {
		return nil, nil, errors.New("-url names no server")
	}
	var ps []int
	for _, p := range strings.Split(pids, ",") {
		if p = strings.TrimSpace(p); p == "" {
			continue
		}
		n, err := strconv.Atoi(p)
		if err != nil || n <= 0 {
			return nil, nil, fmt.Errorf("-pid: %q is not a process ID", p)
		}
		ps = append(ps, n)
	}
	return us, ps, nil
}
