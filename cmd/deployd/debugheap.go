//go:build deployd_heapprofile

package main

import (
	"fmt"
	"os"
	"runtime"
	"runtime/pprof"
	"time"
)

// heapProfileEnv names a file the process rewrites every heapProfileEvery
// with a heap profile (pprof format, sampled every 4 KiB allocated) and, in
// PATH.txt, the runtime's memory statistics. It is a debugging aid for the
// agent's memory (BENCHMARKS.md, "Agent memory"), built only with
// `-tags deployd_heapprofile`: runtime/pprof alone adds ~0.3 MiB to the RSS
// of every agent that links it.
const heapProfileEnv = "DEPLOYD_DEBUG_HEAP_PROFILE"

const heapProfileEvery = 5 * time.Second

// startHeapProfiles starts the writer when heapProfileEnv is set. The
// goroutine lives as long as the process: nobody waits for it, by design.
func startHeapProfiles() {
	path := os.Getenv(heapProfileEnv)
	if path == "" {
		return
	}
	runtime.MemProfileRate = 4 << 10
	go func() {
		for range time.Tick(heapProfileEvery) {
			if err := writeHeapProfile(path); err != nil {
				fmt.Fprintf(os.Stderr, "deployd: %s: %v\n", heapProfileEnv, err)
				return
			}
		}
	}()
}

func writeHeapProfile(path string) error {
	runtime.GC() // the profile shows the live heap as of the last GC
	f, err := os.Create(path)
	if err != nil {
		return err
	}
	if err := pprof.WriteHeapProfile(f); err != nil {
		f.Close()
		return err
	}
	if err := f.Close(); err != nil {
		return err
	}
	var m runtime.MemStats
	runtime.ReadMemStats(&m)
	kib := func(v uint64) uint64 { return v >> 10 }
	s := fmt.Sprintf("KiB: sys %d heap_sys %d heap_inuse %d heap_alloc %d heap_idle %d heap_released %d "+
		"stack_inuse %d mspan %d gc_sys %d other_sys %d buckhash %d next_gc %d num_gc %d goroutines %d\n",
		kib(m.Sys), kib(m.HeapSys), kib(m.HeapInuse), kib(m.HeapAlloc), kib(m.HeapIdle), kib(m.HeapReleased),
		kib(m.StackInuse), kib(m.MSpanInuse), kib(m.GCSys), kib(m.OtherSys), kib(m.BuckHashSys), kib(m.NextGC),
		m.NumGC, runtime.NumGoroutine())
	return os.WriteFile(path+".txt", []byte(s), 0o644)
}
