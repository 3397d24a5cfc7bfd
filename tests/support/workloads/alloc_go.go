// alloc_go MODE SECONDS: the Go twin of alloc.c. A request loop that either allocates per
// request on the Go heap (MODE "alloc": slices that escape, so runtime.mallocgc runs) or
// works on a buffer allocated once at start-up (MODE "prealloc"). About 1000-2000
// requests/s; ends by itself after SECONDS (at most 60).
package main

import (
	"os"
	"strconv"
	"time"
)

var pool = make([]byte, 4096)
var sink []byte // a global: what handleRequestAlloc makes escapes to the heap

//go:noinline
func handleRequestAlloc(i int) byte {
	buf := make([]byte, 256+i&63)
	buf[10] = byte(i)
	more := append(buf, make([]byte, 256)...)
	sink = more
	return more[10]
}

//go:noinline
func handleRequestPrealloc(i int) byte {
	for j := 0; j < 512; j++ {
		pool[j] = byte(i)
	}
	return pool[10]
}

func main() {
	if len(os.Args) < 3 {
		os.Exit(2)
	}
	alloc := os.Args[1] == "alloc"
	secs, err := strconv.ParseFloat(os.Args[2], 64)
	if err != nil || secs <= 0 || secs > 60 {
		secs = 60
	}
	end := time.Now().Add(time.Duration(secs * float64(time.Second)))
	var acc byte
	os.Stdout.Write([]byte("ready\n"))
	for i := 0; time.Now().Before(end); i++ {
		if alloc {
			acc += handleRequestAlloc(i)
		} else {
			acc += handleRequestPrealloc(i)
		}
		time.Sleep(500 * time.Microsecond)
	}
	os.Exit(int(acc) & 0)
}
