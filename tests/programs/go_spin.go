// CPU-bound goroutines (four, each spinning for a while): Go's runtime preempts them
// asynchronously (a SIGURG whose handler moves the goroutine's resume point into
// runtime.asyncPreempt). Prints one number per goroutine.
package main

import (
	"fmt"
	"sync"
)

//go:noinline
func spin(n int) int {
	s := 0
	for i := 0; i < n; i++ {
		if i%3 == 0 {
			s += i
		} else {
			s ^= i
		}
	}
	return s
}

func main() {
	var wg sync.WaitGroup
	results := make([]int, 4)
	for g := 0; g < 4; g++ {
		wg.Add(1)
		go func(g int) {
			defer wg.Done()
			for k := 0; k < 12; k++ {
				results[g] += spin(200000)
			}
		}(g)
	}
	wg.Wait()
	fmt.Println(results)
}
