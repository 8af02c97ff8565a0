package vllm

import (
	"bytes"

	"github.com/pulse-io/pulse/pkg/metric"
)

// combine says how the series of one family (engines, models, finished
// reasons) become one value.
type combine uint8

const (
	sum      combine = iota + 1 // requests, counters, histogram sums and counts
	mean                        // ratios such as KV-cache usage: never summed
	greatest                    // extra gauges only
)

// source is one vLLM sample name that feeds a raw value. When several sources
// feed the same value (V1 and V0 names, old and new histogram names), the one
// with the lower rank that is on the page wins: vLLM versions that emit both
// the new and the deprecated name emit the same number under each.
type source struct {
	id    metric.ID
	extra int   // 1 + index into the extra metrics; 0 for the known values
	hist  uint8 // 1 + the histogram whose buckets it carries; 0 for values
	rank  uint8
	comb  combine
}

// knownSources maps vLLM, SGLang and TGI sample names (as they appear on a line, with their
// _total/_sum/_count suffix) to the raw values they feed.
var knownSources = map[string]source{
	"vllm:num_requests_waiting": {id: metric.Waiting, rank: 0, comb: sum},
	"vllm:num_requests_running": {id: metric.Running, rank: 0, comb: sum},
	"vllm:num_requests_swapped": {id: metric.Swapped, rank: 0, comb: sum},

	"vllm:kv_cache_usage_perc":  {id: metric.KVCacheUsage, rank: 0, comb: mean},
	"vllm:gpu_cache_usage_perc": {id: metric.KVCacheUsage, rank: 1, comb: mean},

	"vllm:prefix_cache_hits_total":        {id: metric.PrefixHits, rank: 0, comb: sum},
	"vllm:gpu_prefix_cache_hits_total":    {id: metric.PrefixHits, rank: 1, comb: sum},
	"vllm:prefix_cache_queries_total":     {id: metric.PrefixQueries, rank: 0, comb: sum},
	"vllm:gpu_prefix_cache_queries_total": {id: metric.PrefixQueries, rank: 1, comb: sum},

	"vllm:prompt_tokens_total":     {id: metric.PromptTokens, rank: 0, comb: sum},
	"vllm:generation_tokens_total": {id: metric.GenerationTokens, rank: 0, comb: sum},
	"vllm:request_success_total":   {id: metric.RequestSuccess, rank: 0, comb: sum},
	"vllm:num_preemptions_total":   {id: metric.Preemptions, rank: 0, comb: sum},

	"vllm:time_to_first_token_seconds_sum":     {id: metric.TTFTSum, rank: 0, comb: sum},
	"vllm:time_to_first_token_seconds_count":   {id: metric.TTFTCount, rank: 0, comb: sum},
	"vllm:request_queue_time_seconds_sum":      {id: metric.QueueTimeSum, rank: 0, comb: sum},
	"vllm:request_queue_time_seconds_count":    {id: metric.QueueTimeCount, rank: 0, comb: sum},
	"vllm:e2e_request_latency_seconds_sum":     {id: metric.E2ELatencySum, rank: 0, comb: sum},
	"vllm:e2e_request_latency_seconds_count":   {id: metric.E2ELatencyCount, rank: 0, comb: sum},
	"vllm:inter_token_latency_seconds_sum":     {id: metric.ITLSum, rank: 0, comb: sum},
	"vllm:inter_token_latency_seconds_count":   {id: metric.ITLCount, rank: 0, comb: sum},
	"vllm:time_per_output_token_seconds_sum":   {id: metric.ITLSum, rank: 1, comb: sum},
	"vllm:time_per_output_token_seconds_count": {id: metric.ITLCount, rank: 1, comb: sum},

	// SGLang (python/sglang/srt/metrics/collector.py): the same meanings
	// under its own names. token_usage is the share of the KV pool's
	// tokens in use: vLLM's KV-cache usage.
	"sglang:num_queue_reqs":                      {id: metric.Waiting, rank: 0, comb: sum},
	"sglang:num_running_reqs":                    {id: metric.Running, rank: 0, comb: sum},
	"sglang:token_usage":                         {id: metric.KVCacheUsage, rank: 0, comb: mean},
	"sglang:prompt_tokens_total":                 {id: metric.PromptTokens, rank: 0, comb: sum},
	"sglang:generation_tokens_total":             {id: metric.GenerationTokens, rank: 0, comb: sum},
	"sglang:num_requests_total":                  {id: metric.RequestSuccess, rank: 0, comb: sum},
	"sglang:time_to_first_token_seconds_sum":     {id: metric.TTFTSum, rank: 0, comb: sum},
	"sglang:time_to_first_token_seconds_count":   {id: metric.TTFTCount, rank: 0, comb: sum},
	"sglang:queue_time_seconds_sum":              {id: metric.QueueTimeSum, rank: 0, comb: sum},
	"sglang:queue_time_seconds_count":            {id: metric.QueueTimeCount, rank: 0, comb: sum},
	"sglang:e2e_request_latency_seconds_sum":     {id: metric.E2ELatencySum, rank: 0, comb: sum},
	"sglang:e2e_request_latency_seconds_count":   {id: metric.E2ELatencyCount, rank: 0, comb: sum},
	"sglang:inter_token_latency_seconds_sum":     {id: metric.ITLSum, rank: 0, comb: sum},
	"sglang:inter_token_latency_seconds_count":   {id: metric.ITLCount, rank: 0, comb: sum},
	"sglang:time_per_output_token_seconds_sum":   {id: metric.ITLSum, rank: 1, comb: sum},
	"sglang:time_per_output_token_seconds_count": {id: metric.ITLCount, rank: 1, comb: sum},

	// Hugging Face TGI (router/src/server.rs and infer/, docs
	// reference/metrics.md): a router's queue and batch, and per-request
	// histograms observed when a request ends. It has no KV-cache gauge and
	// no TTFT or per-token latency histogram (its mean time per token is a
	// per-request mean, not vLLM's inter-token latency: not mapped).
	"tgi_queue_size":                   {id: metric.Waiting, rank: 0, comb: sum},
	"tgi_batch_current_size":           {id: metric.Running, rank: 0, comb: sum},
	"tgi_request_success":              {id: metric.RequestSuccess, rank: 0, comb: sum},
	"tgi_request_input_length_sum":     {id: metric.PromptTokens, rank: 0, comb: sum},
	"tgi_request_generated_tokens_sum": {id: metric.GenerationTokens, rank: 0, comb: sum},
	"tgi_request_queue_duration_sum":   {id: metric.QueueTimeSum, rank: 0, comb: sum},
	"tgi_request_queue_duration_count": {id: metric.QueueTimeCount, rank: 0, comb: sum},
	"tgi_request_duration_sum":         {id: metric.E2ELatencySum, rank: 0, comb: sum},
	"tgi_request_duration_count":       {id: metric.E2ELatencyCount, rank: 0, comb: sum},
}

// histogramSources are the bucket series of the latency histograms an agent
// forwards with --forward-histograms, by the histogram they feed (1 + Hist).
// vLLM renamed time_per_output_token to inter_token_latency (V1); a page
// with both carries the same buckets under each. TGI has neither.
var histogramSources = map[string]source{
	"vllm:time_to_first_token_seconds_bucket":     {hist: 1 + uint8(metric.TTFTHist), rank: 0, comb: sum},
	"vllm:inter_token_latency_seconds_bucket":     {hist: 1 + uint8(metric.ITLHist), rank: 0, comb: sum},
	"vllm:time_per_output_token_seconds_bucket":   {hist: 1 + uint8(metric.ITLHist), rank: 1, comb: sum},
	"sglang:time_to_first_token_seconds_bucket":   {hist: 1 + uint8(metric.TTFTHist), rank: 0, comb: sum},
	"sglang:inter_token_latency_seconds_bucket":   {hist: 1 + uint8(metric.ITLHist), rank: 0, comb: sum},
	"sglang:time_per_output_token_seconds_bucket": {hist: 1 + uint8(metric.ITLHist), rank: 1, comb: sum},
}

// serverPrefixes are the name prefixes of the servers pulse reads: a page
// with a family of one of them is a page pulse can read.
var serverPrefixes = [][]byte{[]byte("vllm:"), []byte("sglang:"), []byte("tgi_")}

func hasServerPrefix(name []byte) bool {
	for _, p := range serverPrefixes {
		if bytes.HasPrefix(name, p) {
			return true
		}
	}
	return false
}
