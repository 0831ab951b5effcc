// Two goroutines play ping-pong over unbuffered channels (10,000 messages by default):
// every switch between them goes through Go's scheduler (gopark, mcall, gogo). Every
// function of ours logs its own enter and exit with the goroutine it runs on, so the
// program says which frames are whose (the oracle for ptscope's stacks). The log is a
// uint64 per event (id<<16 | goroutine<<8 | function<<2 | kind, kind 1 enter, 2 exit),
// written at exit to $PTSCOPE_GO_LOG after a line of function names (the format of
// tests/support/oracles.py: self_log_activations), without fmt: under emulation every
// instruction counts. Run with GOMAXPROCS=1: one thread runs both goroutines.
//
// Our functions and the two loggers are nosplit: a function's stack check is where Go
// preempts a goroutine that ran long (sysmon asks after 10 ms, which a loaded emulator
// reaches), and a switch there, between the call and its enter(), would log the other
// goroutine's call first while the trace has this one's call first. Without the check,
// a call and its log entry are one run of one goroutine.
package main

import (
	"encoding/binary"
	"fmt"
	"os"
	"strconv"
	"strings"
)

var names = []string{"main", "ping", "pong", "relay", "bounce", "tally"}

var events = make([]uint64, 0, 1<<20)
var nextID uint64

//go:noinline
//go:nosplit
func enter(fn, g uint64) uint64 {
	nextID++
	events = append(events, nextID<<16|g<<8|fn<<2|1)
	return nextID
}

//go:noinline
//go:nosplit
func leave(id uint64) {
	events = append(events, id<<16|2)
}

//go:noinline
//go:nosplit
func bounce(v int) int {
	me := enter(4, 1)
	defer leave(me)
	return v + 1
}

//go:noinline
//go:nosplit
func relay(v int) int {
	me := enter(3, 1)
	r := bounce(v)
	leave(me)
	return r
}

//go:noinline
//go:nosplit
func pong(in <-chan int, out chan<- int) {
	me := enter(2, 1)
	for v := range in {
		out <- relay(v)
	}
	close(out)
	leave(me)
}

//go:noinline
//go:nosplit
func tally(sum, v int) int {
	me := enter(5, 0)
	leave(me)
	return sum + v
}

//go:noinline
//go:nosplit
func ping(n int, out chan<- int, in <-chan int) int {
	me := enter(1, 0)
	sum := 0
	for i := 0; i < n; i++ {
		out <- i
		sum = tally(sum, <-in)
	}
	close(out)
	leave(me)
	return sum
}

func writeLog(path string) {
	buf := make([]byte, 0, 8*len(events)+64)
	buf = append(buf, strings.Join(names, " ")...)
	buf = append(buf, '\n')
	for _, e := range events {
		buf = binary.LittleEndian.AppendUint64(buf, e)
	}
	if err := os.WriteFile(path, buf, 0o644); err != nil {
		panic(err)
	}
}

func main() {
	me := enter(0, 0)
	n := 10000
	if len(os.Args) > 1 {
		n, _ = strconv.Atoi(os.Args[1])
	}
	a := make(chan int)
	b := make(chan int)
	go pong(a, b)
	sum := ping(n, a, b)
	<-b // pong closed its channel: it has finished
	leave(me)
	if path := os.Getenv("PTSCOPE_GO_LOG"); path != "" {
		writeLog(path)
	}
	fmt.Println("go", sum)
}
