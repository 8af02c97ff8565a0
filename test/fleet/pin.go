package main

import (
	"fmt"
	"os"
	"strconv"
	"strings"

	"golang.org/x/sys/unix"
)

// cpuSplit divides the CPUs this process may run on: the aggregator gets
// the upper half (at least one), the harness the rest. ok is false with
// fewer than 2 CPUs (nothing to split).
func cpuSplit() (agg, harness []int, ok bool) {
	var set unix.CPUSet
	if err := unix.SchedGetaffinity(0, &set); err != nil {
		return nil, nil, false
	}
	var cpus []int
	for c := range 1024 {
		if set.IsSet(c) {
			cpus = append(cpus, c)
		}
	}
	if len(cpus) < 2 {
		return nil, nil, false
	}
	half := len(cpus) / 2
	return cpus[half:], cpus[:half], true
}

// cpuList writes cpus as taskset's -c list.
func cpuList(cpus []int) string {
	s := make([]string, len(cpus))
	for i, c := range cpus {
		s[i] = strconv.Itoa(c)
	}
	return strings.Join(s, ",")
}

// pinSelf keeps every thread of this process on cpus; threads made later
// inherit the mask of the thread that makes them.
func pinSelf(cpus []int) error {
	var set unix.CPUSet
	for _, c := range cpus {
		set.Set(c)
	}
	tasks, err := os.ReadDir("/proc/self/task")
	if err != nil {
		return err
	}
	for _, t := range tasks {
		tid, err := strconv.Atoi(t.Name())
		if err != nil {
			continue
		}
		if err := unix.SchedSetaffinity(tid, &set); err != nil {
			return fmt.Errorf("pin thread %d to CPUs %s: %w", tid, cpuList(cpus), err)
		}
	}
	return nil
}
