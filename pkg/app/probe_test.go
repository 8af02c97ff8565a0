package app

import (
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
)

// TestProbeExitCodes: 0 for a 200 alone; 1 for another answer, a
// redirect (not followed) or none; 2 for arguments that are not one
// http:// URL.
func TestProbeExitCodes(t *testing.T) {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		switch r.URL.Path {
		case "/ok":
			fmt.Fprintln(w, "ok")
		case "/moved":
			http.Redirect(w, r, "/ok", http.StatusFound)
		default:
			http.Error(w, strings.Repeat("x", 10<<10), http.StatusInternalServerError)
		}
	}))
	defer srv.Close()
	closed := httptest.NewServer(http.NotFoundHandler())
	gone := closed.URL
	closed.Close()
	for _, c := range []struct {
		args []string
		code int
		says string
	}{
		{[]string{srv.URL + "/ok"}, 0, "200 OK: ok"},
		{[]string{srv.URL + "/moved"}, 1, "302"},
		{[]string{srv.URL + "/broken"}, 1, "500"},
		{[]string{gone + "/ok"}, 1, "refused"},
		{nil, 2, "usage"},
		{[]string{srv.URL, srv.URL}, 2, "usage"},
		{[]string{"127.0.0.1:8082/livez"}, 2, "not an http:// URL"},
		{[]string{"https://127.0.0.1:8082/livez"}, 2, "not an http:// URL"},
	} {
		var out strings.Builder
		if code := Probe("pulse-agent", c.args, &out); code != c.code || !strings.Contains(out.String(), c.says) || out.Len() > 1200 {
			t.Errorf("probe %q: exit %d, %.200q; want %d saying %q, at most about 1 KiB", c.args, code, out.String(), c.code, c.says)
		}
	}
}
