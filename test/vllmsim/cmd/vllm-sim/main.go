// Command vllm-sim serves a simulated vLLM /metrics page; see package vllmsim.
package main

import (
	"context"
	"flag"
	"fmt"
	"net/http"
	"os"
	"os/signal"
	"strings"
	"syscall"
	"time"

	"github.com/pulse-io/pulse/pkg/version"
	"github.com/pulse-io/pulse/test/vllmsim"
)

func main() {
	addr := flag.String("addr", "127.0.0.1:8001", "listen address")
	engines := flag.Int("engines", 1, "data-parallel engine ranks (V1)")
	models := flag.String("models", vllmsim.DefaultModel, "comma-separated model names")
	v0 := flag.Bool("v0", false, "serve vLLM V0 naming")
	rate := flag.Float64("arrival-rate", 0, "queueing model: requests/s (0: load is set over HTTP only)")
	capacity := flag.Int("batch-capacity", 16, "queueing model: running requests per engine")
	service := flag.Float64("service-rate", 0.5, "queueing model: completions/s per running request")
	loadTime := flag.Duration("load-time", 0, "simulated model load: /health and /metrics answer 503 for this long after start")
	showVersion := flag.Bool("version", false, "print the version and exit")
	flag.Parse()
	if *showVersion {
		fmt.Println("vllm-sim", version.Version)
		return
	}

	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	s := vllmsim.New(vllmsim.Options{Models: strings.Split(*models, ","), Engines: *engines, V0: *v0, Seed: uint64(time.Now().UnixNano()), LoadTime: *loadTime})
	if *rate > 0 {
		s.SetModel(vllmsim.QueueModel{ArrivalRate: *rate, BatchCapacity: *capacity, ServiceRate: *service})
	}
	go s.RunModel(ctx, 100*time.Millisecond)
	srv := &http.Server{Addr: *addr, Handler: s.Handler(), ReadHeaderTimeout: 5 * time.Second}
	go func() { <-ctx.Done(); _ = srv.Close() }()
	if err := srv.ListenAndServe(); err != nil && err != http.ErrServerClosed {
		fmt.Fprintln(os.Stderr, "vllm-sim:", err)
		os.Exit(1)
	}
}
