package debug

import (
	"fmt"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/pulse-io/pulse/pkg/scaler"
	"github.com/pulse-io/pulse/pkg/store"
)

// TestOneCallersAnswersAreBounded: a caller (a tenant's namespace of
// ServiceAccounts, as the http port's review names it) granted four
// namespaces' pages held every debug answer by asking for four large ones
// and reading none. One caller has one answer under way; another caller's
// is served.
func TestOneCallersAnswersAreBounded(t *testing.T) {
	h := &Handler{}
	release := make(chan struct{})
	started := make(chan struct{}, InFlight)
	blocked := h.checked(func(http.ResponseWriter, *http.Request) {
		started <- struct{}{}
		<-release
	}, false)
	mux := http.NewServeMux()
	mux.HandleFunc("GET /debug/triggers/{namespace}", func(w http.ResponseWriter, r *http.Request) {
		blocked(w, r.WithContext(WithCaller(r.Context(), r.Header.Get("X-Caller"))))
	})
	srv := httptest.NewServer(mux)
	defer srv.Close()
	ask := func(ns, caller string) chan int { return askAs(srv.URL+"/debug/triggers/"+ns, caller) }
	first := ask("team-1", "serviceaccounts:team-a")
	<-started
	if c := <-ask("team-2", "serviceaccounts:team-a"); c != http.StatusServiceUnavailable {
		t.Fatalf("the caller's second answer at once, another namespace's: %d, want 503", c)
	}
	other := ask("team-3", "serviceaccounts:team-b")
	<-started
	close(release)
	if a, b := <-first, <-other; a != http.StatusOK || b != http.StatusOK {
		t.Fatalf("the first caller's answer %d, another caller's %d; want both served", a, b)
	}
}

// manyTriggers is a source whose team-1 to team-4 pages are some 8 MB
// each: more than the sockets between a client and the server hold. Any
// other namespace's is one trigger's.
type manyTriggers struct{}

func (manyTriggers) EvaluationsOf(ns string) []scaler.Evaluation {
	n := 1
	if ns >= "team-1" && ns <= "team-4" {
		n = 2000
	}
	out := make([]scaler.Evaluation, 0, n)
	for i := range n {
		e := scaler.Evaluation{TriggerID: scaler.TriggerID{Namespace: ns, ScaledObject: fmt.Sprintf("so-%d-%s", i, strings.Repeat("x", 200))}, At: time.Now()}
		e.Trigger.Workload = store.Key{Namespace: ns, Kind: "Workspace", Name: "w"}
		e.Trigger.Threshold = 1
		for p := range 32 {
			e.Decision.Pods = append(e.Decision.Pods, scaler.PodDecision{Name: fmt.Sprintf("pod-%d-%s", p, strings.Repeat("y", 100)), Use: "counted"})
		}
		out = append(out, e)
	}
	return out
}

// TestAnAnswerNotReadIsGivenBack: clients each asked a namespace's
// large page and read nothing, and every other reader was refused 503
// until the port's write timeout (a minute), over and over. An answer's
// writing is bounded (answerWrite) for a reviewed caller: past it its slot
// is given back.
func TestAnAnswerNotReadIsGivenBack(t *testing.T) {
	defer func(d time.Duration) { answerWrite = d }(answerWrite)
	// Long enough that the check below lands while the four are held
	// (300 ms was near a race on a loaded machine).
	answerWrite = 2 * time.Second
	mux := http.NewServeMux()
	h := &Handler{Store: store.New(store.Options{}), FreshFor: time.Minute, MaxWindow: time.Minute, Triggers: manyTriggers{}}
	h.Register(mux)
	// Reviewed callers, as the http port's review names them (the bound is
	// theirs: a port with no review keeps the server's own).
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mux.ServeHTTP(w, r.WithContext(WithCaller(r.Context(), r.Header.Get("X-Caller"))))
	}))
	defer srv.Close()
	for i := 1; i <= InFlightNamespaced; i++ {
		c, err := net.Dial("tcp", strings.TrimPrefix(srv.URL, "http://"))
		if err != nil {
			t.Fatal(err)
		}
		_ = c.(*net.TCPConn).SetReadBuffer(4096)
		defer func() { _ = c.Close() }()
		if _, err := fmt.Fprintf(c, "GET /debug/triggers/team-%d HTTP/1.1\r\nHost: x\r\nX-Caller: serviceaccounts:team-%d\r\n\r\n", i, i); err != nil {
			t.Fatal(err)
		}
	}
	for deadline := time.Now().Add(time.Minute); ; time.Sleep(time.Millisecond) {
		if all, _ := h.namespaced.Held(""); all == InFlightNamespaced {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the %d namespaces' answers never under way at once", InFlightNamespaced)
		}
	}
	if code, _ := get(t, srv.URL+"/debug/triggers/team-9", ""); code != http.StatusServiceUnavailable {
		t.Fatalf("another reader while the %d are under way: %d, want 503", InFlightNamespaced, code)
	}
	// However long they take to be cut, another reader is served once
	// they are.
	for deadline := time.Now().Add(time.Minute); ; time.Sleep(50 * time.Millisecond) {
		code, body := get(t, srv.URL+"/debug/triggers/team-9", "")
		if code == http.StatusOK {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("another reader while four clients read nothing: %d %.200s; want served once their answers' writing is cut", code, body)
		}
	}
}

// TestTenantsLeaveTheOperatorAnAnswer: four tenants, each asking for a
// page of its own namespace and reading none, held every answer, the
// operator's cluster-wide page's too. Namespaces' pages take at most
// InFlightNamespaced answers; the last is a cluster-wide page's.
func TestTenantsLeaveTheOperatorAnAnswer(t *testing.T) {
	h := &Handler{}
	release := make(chan struct{})
	started := make(chan struct{}, InFlight)
	blocked := h.checked(func(http.ResponseWriter, *http.Request) {
		started <- struct{}{}
		<-release
	}, false)
	mux := http.NewServeMux()
	serve := func(w http.ResponseWriter, r *http.Request) {
		blocked(w, r.WithContext(WithCaller(r.Context(), r.Header.Get("X-Caller"))))
	}
	mux.HandleFunc("GET /debug/triggers", serve)
	mux.HandleFunc("GET /debug/triggers/{namespace}", serve)
	srv := httptest.NewServer(mux)
	defer srv.Close()
	ask := func(path, caller string) chan int { return askAs(srv.URL+path, caller) }
	var held []chan int
	for i := 1; i <= InFlightNamespaced; i++ {
		held = append(held, ask(fmt.Sprintf("/debug/triggers/team-%d", i), fmt.Sprintf("serviceaccounts:team-%d", i)))
		<-started
	}
	select {
	case c := <-ask("/debug/triggers/team-9", "serviceaccounts:team-9"):
		if c != http.StatusServiceUnavailable {
			t.Fatalf("a fourth tenant's page while %d are held: %d, want 503", InFlightNamespaced, c)
		}
	case <-started:
		close(release)
		t.Fatalf("a fourth tenant's page while %d are held took the last answer", InFlightNamespaced)
	}
	op := ask("/debug/triggers", "user:admin")
	<-started
	close(release)
	if c := <-op; c != http.StatusOK {
		t.Fatalf("the cluster-wide page while the tenants' are held: %d, want 200", c)
	}
	for i, c := range held {
		if code := <-c; code != http.StatusOK {
			t.Fatalf("tenant %d's page: %d, want 200", i+1, code)
		}
	}
}

// askAs gets url as caller (the X-Caller header the tests' servers name
// it by), and gives its status (0: no answer) on the channel returned.
func askAs(url, caller string) chan int {
	code := make(chan int, 1)
	go func() {
		req, _ := http.NewRequest(http.MethodGet, url, nil)
		req.Header.Set("X-Caller", caller)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			code <- 0
			return
		}
		_ = resp.Body.Close()
		code <- resp.StatusCode
	}()
	return code
}
