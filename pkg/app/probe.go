package app

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strings"
	"time"
)

// ProbeTimeout bounds pulse-agent probe's request.
const ProbeTimeout = 5 * time.Second

// Probe is `PROG probe URL` (pulse-agent's, pulse-aggregator's): the
// kubelet's exec probe of the health port (--health-addr, the charts' on
// the pod's loopback, which no other pod reaches: the ports other pods
// reach have connection bounds that their connections can fill, leaving
// a probe no room). It GETs URL and returns the exit code: 0 for a 200,
// 1 for any other answer or none (what it got written to out), 2 for
// arguments that are not one http:// URL.
func Probe(prog string, args []string, out io.Writer) int {
	if len(args) != 1 {
		fmt.Fprintf(out, "usage: %s probe URL (e.g. http://127.0.0.1:8082/livez)\n", prog)
		return 2
	}
	u, err := url.Parse(args[0])
	if err != nil || u.Scheme != "http" || u.Host == "" {
		fmt.Fprintf(out, "%s probe: %q is not an http:// URL\n", prog, args[0])
		return 2
	}
	ctx, cancel := context.WithTimeout(context.Background(), ProbeTimeout)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, u.String(), nil)
	if err != nil {
		fmt.Fprintf(out, "%s probe: %v\n", prog, err)
		return 2
	}
	// Its own client: no proxy from the environment, no redirect followed.
	c := &http.Client{Transport: &http.Transport{DisableKeepAlives: true},
		CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}
	resp, err := c.Do(req)
	if err != nil {
		fmt.Fprintf(out, "%s probe: %v\n", prog, err)
		return 1
	}
	defer func() { _ = resp.Body.Close() }()
	body, _ := io.ReadAll(io.LimitReader(resp.Body, 1024))
	fmt.Fprintf(out, "%s: %s\n", resp.Status, strings.TrimSpace(string(body)))
	if resp.StatusCode != http.StatusOK {
		return 1
	}
	return 0
}
