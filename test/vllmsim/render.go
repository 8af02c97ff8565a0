package vllmsim

import "strconv"

// Page renders the /metrics page in Prometheus text format 0.0.4, or in
// OpenMetrics 1.0 when openMetrics is set, as vLLM's prometheus_client does.
func (s *Server) Page(openMetrics bool) []byte {
	s.mu.Lock()
	defer s.mu.Unlock()
	w := &pageWriter{openMetrics: openMetrics}
	s.writeProcess(w)
	if s.opts.V0 {
		s.writeV0(w)
	} else {
		s.writeV1(w)
	}
	if openMetrics {
		w.b.WriteString("# EOF\n")
	}
	return []byte(w.b.String())
}

func (s *Server) writeProcess(w *pageWriter) {
	w.family("python_gc_objects_collected_total", "counter", "Objects collected during gc")
	for g, v := range []float64{66525, 18311, 1431} {
		w.sample("python_gc_objects_collected_total", []string{"generation", strconv.Itoa(g)}, v)
	}
	w.family("python_gc_collections_total", "counter", "Number of times this generation was collected")
	for g, v := range []float64{1082, 96, 78} {
		w.sample("python_gc_collections_total", []string{"generation", strconv.Itoa(g)}, v)
	}
	w.family("python_info", "gauge", "Python platform information")
	w.sample("python_info", []string{"implementation", "CPython", "major", "3", "minor", "12", "patchlevel", "11", "version", "3.12.11"}, 1)
	w.family("process_virtual_memory_bytes", "gauge", "Virtual memory size in bytes.")
	w.sample("process_virtual_memory_bytes", nil, 3.9024848896e+10)
	w.family("process_resident_memory_bytes", "gauge", "Resident memory size in bytes.")
	w.sample("process_resident_memory_bytes", nil, 5.8330112e+09)
	w.family("process_start_time_seconds", "gauge", "Start time of the process since unix epoch in seconds.")
	w.sample("process_start_time_seconds", nil, s.created)
	w.family("process_cpu_seconds_total", "counter", "Total user and system CPU time spent in seconds.")
	w.sample("process_cpu_seconds_total", nil, 78.41)
	w.family("process_open_fds", "gauge", "Number of open file descriptors.")
	w.sample("process_open_fds", nil, 76)
}

// labels of a series: V1 labels every series with model_name and engine.
func (s *Server) labels(sr *series) []string {
	if s.opts.V0 {
		return []string{"model_name", sr.model}
	}
	return []string{"model_name", sr.model, "engine", sr.engine}
}

func (s *Server) gauge(w *pageWriter, name, help string, get func(*series) float64) {
	w.family(name, "gauge", help)
	for _, sr := range s.series {
		w.sample(name, s.labels(sr), get(sr))
	}
}

func (s *Server) counter(w *pageWriter, name, help string, get func(*series) float64) {
	w.family(name, "counter", help)
	for _, sr := range s.series {
		w.sample(name, s.labels(sr), get(sr))
	}
	s.writeCreated(w, name, help)
}

// writeCreated writes a counter's or histogram's _created family, as
// prometheus_client does in text format 0.0.4 (OpenMetrics has it inline).
func (s *Server) writeCreated(w *pageWriter, name, help string) {
	base := name
	if len(base) > 6 && base[len(base)-6:] == "_total" {
		base = base[:len(base)-6]
	}
	if !w.openMetrics {
		w.family(base+"_created", "gauge", help)
	}
	for _, sr := range s.series {
		w.sample(base+"_created", s.labels(sr), s.created)
	}
}

func (s *Server) histo(w *pageWriter, name, help string, get func(*series) *histogram) {
	w.family(name, "histogram", help)
	for _, sr := range s.series {
		w.histogram(name, s.labels(sr), get(sr))
	}
	s.writeCreated(w, name, help)
}

func (s *Server) writeV1(w *pageWriter) {
	w.family("vllm:cache_config_info", "gauge", "Information of the LLMEngine CacheConfig")
	for e := range s.opts.Engines {
		w.sample("vllm:cache_config_info", []string{"block_size", "16", "cache_dtype", "auto",
			"calculate_kv_scales", "False", "cpu_offload_gb", "0", "enable_prefix_caching", "True",
			"engine", strconv.Itoa(e), "gpu_memory_utilization", "0.9",
			"is_attention_free", "False", "num_cpu_blocks", "None", "num_gpu_blocks", "27798",
			"num_gpu_blocks_override", "None", "prefix_caching_hash_algo", "builtin", "sliding_window", "None",
			"swap_space", "4", "swap_space_bytes", "4294967296"}, 1)
	}
	s.gauge(w, "vllm:num_requests_running", "Number of requests in model execution batches.", func(sr *series) float64 { return sr.running })
	s.gauge(w, "vllm:num_requests_waiting", "Number of requests waiting to be processed.", func(sr *series) float64 { return sr.waiting })
	s.gauge(w, "vllm:kv_cache_usage_perc", "KV-cache usage. 1 means 100 percent usage.", func(sr *series) float64 { return sr.kv })
	s.counter(w, "vllm:prefix_cache_queries_total", "Prefix cache queries, in terms of number of queried tokens.", func(sr *series) float64 { return sr.prefixQueries })
	s.counter(w, "vllm:prefix_cache_hits_total", "Prefix cache hits, in terms of number of cached tokens.", func(sr *series) float64 { return sr.prefixHits })
	s.counter(w, "vllm:num_preemptions_total", "Cumulative number of preemption from the engine.", func(sr *series) float64 { return sr.preemptions })
	s.counter(w, "vllm:prompt_tokens_total", "Number of prefill tokens processed.", func(sr *series) float64 { return sr.promptTokens })
	s.counter(w, "vllm:generation_tokens_total", "Number of generation tokens processed.", func(sr *series) float64 { return sr.genTokens })
	s.successFamily(w)
	s.histo(w, "vllm:request_prompt_tokens", "Number of prefill tokens processed.", func(sr *series) *histogram { return &sr.promptLen })
	s.histo(w, "vllm:request_generation_tokens", "Number of generation tokens processed.", func(sr *series) *histogram { return &sr.genLen })
	s.histo(w, "vllm:iteration_tokens_total", "Histogram of number of tokens per engine_step.", func(sr *series) *histogram { return &sr.iteration })
	s.histo(w, "vllm:request_max_num_generation_tokens", "Histogram of maximum number of requested generation tokens.", func(sr *series) *histogram { return &sr.maxGen })
	s.histo(w, "vllm:request_params_n", "Histogram of the n request parameter.", func(sr *series) *histogram { return &sr.paramsN })
	s.histo(w, "vllm:time_to_first_token_seconds", "Histogram of time to first token in seconds.", func(sr *series) *histogram { return &sr.ttft })
	s.histo(w, "vllm:time_per_output_token_seconds", "Histogram of time per output token in seconds.DEPRECATED: Use vllm:inter_token_latency_seconds instead.", func(sr *series) *histogram { return &sr.tpot })
	s.histo(w, "vllm:inter_token_latency_seconds", "Histogram of inter-token latency in seconds.", func(sr *series) *histogram { return &sr.itl })
	s.histo(w, "vllm:e2e_request_latency_seconds", "Histogram of e2e request latency in seconds.", func(sr *series) *histogram { return &sr.e2e })
	s.histo(w, "vllm:request_queue_time_seconds", "Histogram of time spent in WAITING phase for request.", func(sr *series) *histogram { return &sr.queue })
	s.histo(w, "vllm:request_inference_time_seconds", "Histogram of time spent in RUNNING phase for request.", func(sr *series) *histogram { return &sr.inference })
	s.histo(w, "vllm:request_prefill_time_seconds", "Histogram of time spent in PREFILL phase for request.", func(sr *series) *histogram { return &sr.prefill })
	s.histo(w, "vllm:request_decode_time_seconds", "Histogram of time spent in DECODE phase for request.", func(sr *series) *histogram { return &sr.decode })
}

func (s *Server) successFamily(w *pageWriter) {
	const name, help = "vllm:request_success_total", "Count of successfully processed requests."
	w.family(name, "counter", help)
	for _, sr := range s.series {
		for i, r := range finishedReasons {
			w.sample(name, append(s.labels(sr), "finished_reason", r), sr.success[i])
		}
	}
	if !w.openMetrics {
		w.family("vllm:request_success_created", "gauge", help)
	}
	for _, sr := range s.series {
		for _, r := range finishedReasons {
			w.sample("vllm:request_success_created", append(s.labels(sr), "finished_reason", r), s.created)
		}
	}
}

func (s *Server) writeV0(w *pageWriter) {
	w.family("vllm:cache_config_info", "gauge", "information of cache_config")
	w.sample("vllm:cache_config_info", []string{"block_size", "16", "cache_dtype", "auto", "cpu_offload_gb", "0",
		"enable_prefix_caching", "False", "gpu_memory_utilization", "0.9", "num_cpu_blocks", "2048",
		"num_gpu_blocks", "4574", "num_gpu_blocks_override", "None", "sliding_window", "None",
		"swap_space_bytes", "4294967296"}, 1)
	s.gauge(w, "vllm:num_requests_running", "Number of requests currently running on GPU.", func(sr *series) float64 { return sr.running })
	s.gauge(w, "vllm:num_requests_waiting", "Number of requests waiting to be processed.", func(sr *series) float64 { return sr.waiting })
	s.gauge(w, "vllm:num_requests_swapped", "Number of requests swapped to CPU.", func(sr *series) float64 { return sr.swapped })
	s.gauge(w, "vllm:gpu_cache_usage_perc", "GPU KV-cache usage. 1 means 100 percent usage.", func(sr *series) float64 { return sr.kv })
	s.gauge(w, "vllm:cpu_cache_usage_perc", "CPU KV-cache usage. 1 means 100 percent usage.", func(*series) float64 { return 0 })
	s.counter(w, "vllm:num_preemptions_total", "Cumulative number of preemption from the engine.", func(sr *series) float64 { return sr.preemptions })
	s.counter(w, "vllm:prompt_tokens_total", "Number of prefill tokens processed.", func(sr *series) float64 { return sr.promptTokens })
	s.counter(w, "vllm:generation_tokens_total", "Number of generation tokens processed.", func(sr *series) float64 { return sr.genTokens })
	s.histo(w, "vllm:time_to_first_token_seconds", "Histogram of time to first token in seconds.", func(sr *series) *histogram { return &sr.ttft })
	s.histo(w, "vllm:time_per_output_token_seconds", "Histogram of time per output token in seconds.", func(sr *series) *histogram { return &sr.tpot })
	s.histo(w, "vllm:e2e_request_latency_seconds", "Histogram of end to end request latency in seconds.", func(sr *series) *histogram { return &sr.e2e })
	s.histo(w, "vllm:request_prompt_tokens", "Number of prefill tokens processed.", func(sr *series) *histogram { return &sr.promptLen })
	s.histo(w, "vllm:request_generation_tokens", "Number of generation tokens processed.", func(sr *series) *histogram { return &sr.genLen })
	s.histo(w, "vllm:request_params_n", "Histogram of the n request parameter.", func(sr *series) *histogram { return &sr.paramsN })
	s.successFamily(w)
}
