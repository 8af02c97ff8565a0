package bench

import (
	"encoding/json"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"

	"github.com/pulse-io/pulse/pkg/sim/plot"
)

// Write writes scoreboard.json, scoreboard.md and one frontier picture a
// case into dir, returning the files written.
func Write(sb *Scoreboard, dir, format string) ([]string, error) {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, fmt.Errorf("create %s: %w", dir, err)
	}
	var files []string
	b, err := json.MarshalIndent(sb, "", "  ")
	if err != nil {
		return nil, err
	}
	f := filepath.Join(dir, "scoreboard.json")
	if err := os.WriteFile(f, append(b, '\n'), 0o644); err != nil {
		return nil, fmt.Errorf("write %s: %w", f, err)
	}
	files = append(files, f)
	var pics []string
	if !sb.NoReferences { // with no frontier, a picture shows one point
		pics = make([]string, len(sb.Cases))
	}
	for i := range pics {
		c := sb.Cases[i]
		pics[i] = fmt.Sprintf("frontier-%d-%s.%s", i+1, plot.FileName(c.Trace+"-"+c.Profile+"-"+strings.TrimSuffix(filepath.Base(c.ScaledObject), ".yaml")), format)
		if err := WriteFrontier(caseName(c), c.Pipelines, c.StaticFrontier, c.ClairvoyantFrontier, filepath.Join(dir, pics[i]), format); err != nil {
			return files, err
		}
		files = append(files, filepath.Join(dir, pics[i]))
	}
	md, err := os.Create(filepath.Join(dir, "scoreboard.md"))
	if err != nil {
		return files, fmt.Errorf("write scoreboard.md: %w", err)
	}
	Markdown(md, sb, pics)
	if err := md.Close(); err != nil {
		return files, fmt.Errorf("write scoreboard.md: %w", err)
	}
	return append(files, filepath.Join(dir, "scoreboard.md")), nil
}

// WriteFrontier draws the pipelines' scores after the warm-up beside the
// static and clairvoyant frontiers into file.
func WriteFrontier(title string, pipelines []*Score, static, clairvoyant []Point, file, format string) error {
	return plot.Frontier(title, points(pipelines), frontierPoints(static), frontierPoints(clairvoyant), file, format)
}

func points(scores []*Score) []plot.FrontierPoint {
	out := make([]plot.FrontierPoint, len(scores))
	for i, s := range scores {
		out[i] = plot.FrontierPoint{Name: s.Pipeline, GPUHours: s.GPUHoursAfterWarmup, SLO: s.SLOAfterWarmup}
	}
	return out
}

func frontierPoints(front []Point) []plot.FrontierPoint {
	out := make([]plot.FrontierPoint, len(front))
	for i, p := range front {
		out[i] = plot.FrontierPoint{Name: p.Pipeline, GPUHours: p.GPUHours, SLO: p.SLO}
	}
	return out
}

// staticCostNote says what the column of StaticCost is.
const staticCostNote = " GPU-h ÷ a fixed fleet as good: the pipeline's GPU-hours over the cheapest fixed fleet's that attains as much, within half a point " +
	"(above 1: a fixed fleet as good costs less, which Δ static, a test of height alone, does not show; — where no fixed fleet attains as much)."

func pct(v float64) string { return fmt.Sprintf("%.1f %%", 100*v) }

func pts(v *float64) string {
	if v == nil {
		return "—"
	}
	return fmt.Sprintf("%+.1f", 100**v)
}

func ratio(v *float64) string {
	if v == nil {
		return "—"
	}
	return fmt.Sprintf("%.2f", *v)
}

// Markdown writes the scoreboard as Markdown (pics: each case's picture).
func Markdown(w io.Writer, sb *Scoreboard, pics []string) {
	fmt.Fprintf(w, "# pulse-sim scoreboard: %s\n\n", sb.Suite)
	start := "at the HPA's minimum"
	if sb.WarmStart {
		start = "warm, as the references do"
	}
	fmt.Fprintf(w, "Seeds %v; TTFT SLO %gs; scores after a %gs warm-up unless said; each a mean over the seeds; the signal pipelines start %s.", sb.Seeds, sb.TTFTSLOSeconds, sb.WarmupSeconds, start)
	switch {
	case sb.NoReferences:
	case sb.StaticOnly:
		fmt.Fprintf(w, " Δ static: the pipeline's attainment minus the static frontier's at its GPU-hours, in points "+
			"(— where it used fewer GPU-hours than any fixed fleet)."+staticCostNote)
	default:
		fmt.Fprintf(w, " Δ static and Δ clairvoyant: the pipeline's attainment minus the frontier's at its GPU-hours, in points "+
			"(— where it used fewer GPU-hours than any point of that frontier)."+staticCostNote)
	}
	fmt.Fprint(w, "\n\n")
	switch {
	case sb.NoReferences:
		fmt.Fprintf(w, "**No references were run** (`pulse-sim bench --references=false`): the pipelines' scores alone, with no frontier to measure them against.\n\n")
	case sb.StaticOnly:
		fmt.Fprintf(w, "**Only the fixed fleets were run of the references** (`pulse-sim bench --references=static`): no clairvoyant frontier, and no distance to one.\n\n")
	case len(sb.AboveClairvoyant) == 0:
		fmt.Fprintf(w, "**The clairvoyant frontier bounds every pipeline of every case.**\n\n")
	default:
		fmt.Fprintf(w, "**Above the clairvoyant frontier** (it does not bound these): %s.\n\n", strings.Join(sb.AboveClairvoyant, "; "))
	}
	for i, c := range sb.Cases {
		fmt.Fprintf(w, "## %s\n\n", caseName(c))
		fmt.Fprintf(w, "%d requests; trigger `%s` threshold %g.\n\n", c.Requests, c.Metric, c.Threshold)
		pipelineRows(w, c.Pipelines, sb.NoReferences, !sb.StaticOnly)
		fmt.Fprintln(w)
		if !sb.NoReferences {
			fmt.Fprintf(w, "Static frontier (after warm-up): %s.\n\n", frontierText(c.StaticFrontier))
		}
		if !sb.NoReferences && !sb.StaticOnly {
			fmt.Fprintf(w, "Clairvoyant frontier (after warm-up; its sweep, the switches and the fixed fleets): %s.\n\n", frontierText(c.ClairvoyantFrontier))
		}
		if len(c.StaticAboveSweep) > 0 {
			fmt.Fprintf(w, "Fixed fleets above the clairvoyant sweep alone: %s.\n\n", strings.Join(c.StaticAboveSweep, ", "))
		}
		if p := c.PulseMinusPrometheus; p != nil {
			fmt.Fprintf(w, "pulse − prometheus, paired by seed (n = %d): SLO %+.1f ± %.1f points, GPU-hours %+.2f ± %.2f (mean ± standard error).\n\n",
				p.N, 100*p.SLOMean, 100*p.SLOStdErr, p.GPUHoursMean, p.GPUHoursStdErr)
		}
		for _, s := range c.Skipped {
			fmt.Fprintf(w, "Not run: %s.\n\n", s)
		}
		if i < len(pics) {
			fmt.Fprintf(w, "![frontier](%s)\n\n", pics[i])
		}
	}
}

// pipelineRows writes the table of the pipelines' scores: with no
// references, without the distances to the frontiers there are none of;
// without the clairvoyant family (clairvoyant false), with the distances
// to the static frontier alone.
func pipelineRows(w io.Writer, scores []*Score, noReferences, clairvoyant bool) {
	type column struct {
		head string
		cell func(*Score) string
	}
	f2 := func(x float64) string { return fmt.Sprintf("%.2f", x) }
	f1 := func(x float64) string { return fmt.Sprintf("%.1f", x) }
	static, clair := !noReferences, !noReferences && clairvoyant
	var cols []column
	add := func(on bool, head string, cell func(*Score) string) {
		if on {
			cols = append(cols, column{head, cell})
		}
	}
	add(true, "pipeline", func(s *Score) string { return s.Pipeline })
	add(true, "SLO after warm-up", func(s *Score) string { return pct(s.SLOAfterWarmup) })
	add(true, "GPU-h after warm-up", func(s *Score) string { return f2(s.GPUHoursAfterWarmup) })
	add(true, "goodput / GPU-h", func(s *Score) string { return fmt.Sprintf("%.0f", s.GoodputPerGPUHour) })
	add(static, "Δ static", func(s *Score) string { return pts(s.ToStatic) })
	add(static, "GPU-h ÷ a fixed fleet as good", func(s *Score) string { return ratio(s.StaticCost) })
	add(clair, "Δ clairvoyant", func(s *Score) string { return pts(s.ToClairvoyant) })
	add(true, "SLO (whole run)", func(s *Score) string { return pct(s.SLO) })
	add(true, "GPU-h (whole run)", func(s *Score) string { return f2(s.GPUHours) })
	add(static, "Δ static (whole)", func(s *Score) string { return pts(s.ToStaticWholeRun) })
	add(clair, "Δ clairvoyant (whole)", func(s *Score) string { return pts(s.ToClairvoyantWholeRun) })
	add(true, "scale events", func(s *Score) string { return f1(s.ScaleEvents) })
	add(true, "reversals", func(s *Score) string { return f1(s.Reversals) })
	row := func(cells func(column) string) {
		parts := make([]string, len(cols))
		for i, c := range cols {
			parts[i] = cells(c)
		}
		fmt.Fprintf(w, "| %s |\n", strings.Join(parts, " | "))
	}
	row(func(c column) string { return c.head })
	fmt.Fprintln(w, "|---"+strings.Repeat("|---:", len(cols)-1)+"|")
	for _, s := range scores {
		row(func(c column) string { return c.cell(s) })
	}
}

func frontierText(front []Point) string {
	parts := make([]string, len(front))
	for i, p := range front {
		parts[i] = fmt.Sprintf("%s %s at %.2f", p.Pipeline, pct(p.SLO), p.GPUHours)
	}
	return strings.Join(parts, "; ")
}
