package testutil

import (
	"syscall"
	"testing"
	"time"
)

// ReportCPUPerOp starts counting the process's CPU time (user and
// system, every goroutine's); the function it returns reports it per
// operation as "cpu-µs/op". A benchmark whose operations wait (on a
// database, on each other) shows beside its wall time what they cost:
//
//	defer testutil.ReportCPUPerOp(b)()
func ReportCPUPerOp(b *testing.B) func() {
	start := processCPU()
	return func() {
		b.ReportMetric(float64((processCPU()-start).Microseconds())/float64(b.N), "cpu-µs/op")
	}
}

func processCPU() time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}
