package debug

import (
	"fmt"
	"net/http"
	"text/tabwriter"
	"time"

	"github.com/pulse-io/pulse/pkg/provision"
)

// ProvisioningSource is the provisioner's state: whether this replica
// leads, and what it last did for each annotated workload.
type ProvisioningSource interface {
	// ProvisioningOf is the state of namespace ns's workloads alone ("":
	// every namespace's).
	ProvisioningOf(ns string) provision.Provisioning
}

var _ ProvisioningSource = (*provision.Controller)(nil)

// serveProvisioning: GET /debug/provisioning, and of one namespace.
func (h *Handler) serveProvisioning(w http.ResponseWriter, r *http.Request) {
	p := h.Provisioning.ProvisioningOf(r.PathValue("namespace"))
	if p.Workloads == nil {
		p.Workloads = []provision.Status{}
	}
	if !wantsTable(r) {
		writeJSON(w, p)
		return
	}
	w.Header().Set("Content-Type", "text/plain; charset=utf-8")
	switch {
	case p.Leading:
		fmt.Fprintf(w, "this replica (%s) leads and provisions\n\n", p.Identity)
	case p.Leader != "":
		fmt.Fprintf(w, "this replica (%s) stands by; %s provisions (its /debug/provisioning has the workloads)\n\n", p.Identity, p.Leader)
	default:
		fmt.Fprintf(w, "this replica (%s) stands by; no leader yet\n\n", p.Identity)
	}
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "WORKLOAD\tSTATE\tSCALEDOBJECT\tSINCE\tMESSAGE")
	now := time.Now()
	for _, s := range p.Workloads {
		fmt.Fprintf(tw, "%s %s/%s\t%s\t%s\t%s\t%s\n", s.Kind, s.Namespace, cell(s.Name), s.State, cell(s.ScaledObject),
			now.Sub(s.Since).Round(time.Second), cell(s.Message))
	}
	_ = tw.Flush()
}
