// Package plot draws pulse-sim's pictures with gonum.org/v1/plot: per
// pipeline, four panels over time (load, replicas, queue, TTFT), and one
// picture comparing the pipelines' replica counts.
package plot

import (
	"fmt"
	"image/color"
	"math"
	"os"
	"path/filepath"
	"strings"

	"gonum.org/v1/plot"
	"gonum.org/v1/plot/plotter"
	"gonum.org/v1/plot/vg"
	"gonum.org/v1/plot/vg/draw"
	"gonum.org/v1/plot/vg/vgimg"
	"gonum.org/v1/plot/vg/vgsvg"

	"github.com/pulse-io/pulse/pkg/sim"
)

var palette = []color.Color{
	color.RGBA{31, 119, 180, 255}, color.RGBA{255, 127, 14, 255}, color.RGBA{44, 160, 44, 255},
	color.RGBA{214, 39, 40, 255}, color.RGBA{148, 103, 189, 255}, color.RGBA{140, 86, 75, 255},
}

// Write draws the report's pictures into dir, as PNG or SVG (format "png"
// or "svg"), and returns the files written; references false leaves the
// static and clairvoyant pipelines out of them (a reference sweep would
// draw dozens).
func Write(r *sim.Report, dir, format string, references bool) ([]string, error) {
	if format != "png" && format != "svg" {
		return nil, fmt.Errorf("picture format %q: png or svg", format)
	}
	var files []string
	shown := *r
	shown.Pipelines = nil
	for _, p := range r.Pipelines {
		if _, ref := sim.Reference(p.Pipeline); references || !ref {
			shown.Pipelines = append(shown.Pipelines, p)
		}
	}
	r = &shown
	for _, p := range r.Pipelines {
		f := filepath.Join(dir, FileName(p.Pipeline)+"."+format)
		if err := save(panels(r, p), f, format, 4); err != nil {
			return files, err
		}
		files = append(files, f)
	}
	cmp, err := compare(r)
	if err != nil {
		return files, err
	}
	f := filepath.Join(dir, "replicas."+format)
	if err := save([]*plot.Plot{cmp}, f, format, 1); err != nil {
		return files, err
	}
	return append(files, f), nil
}

// FileName is a pipeline's name as a file name: static:3 becomes static-3,
// clairvoyant:utilisation=0.5,window=30s clairvoyant-utilisation-0.5-window-30s.
func FileName(name string) string {
	return strings.Map(func(r rune) rune {
		switch {
		case r >= 'a' && r <= 'z', r >= 'A' && r <= 'Z', r >= '0' && r <= '9', r == '.', r == '_':
			return r
		}
		return '-'
	}, name)
}

// FrontierPoint is one point of a frontier picture.
type FrontierPoint struct {
	Name     string
	GPUHours float64
	SLO      float64 // 0..1
}

// Frontier draws SLO attainment against GPU-hours: every pipeline a
// labelled point, the static and clairvoyant frontiers as step lines (the
// best attainment reachable with no more GPU-hours), into file.
func Frontier(title string, pipelines, static, clairvoyant []FrontierPoint, file, format string) error {
	p := plot.New()
	p.Title.Text = title
	p.X.Label.Text = "GPU-hours (after the warm-up)"
	p.Y.Label.Text = "requests within the TTFT SLO (after the warm-up), %"
	p.Y.Min, p.Y.Max = 0, 100
	p.Add(plotter.NewGrid())
	maxX := 0.0
	for _, set := range [][]FrontierPoint{pipelines, static, clairvoyant} {
		for _, q := range set {
			maxX = math.Max(maxX, q.GPUHours)
		}
	}
	p.X.Min, p.X.Max = 0, maxX*1.05+0.01
	steps := func(front []FrontierPoint) plotter.XYs {
		var xy plotter.XYs
		for i, q := range front {
			if i > 0 {
				xy = append(xy, plotter.XY{X: q.GPUHours, Y: 100 * front[i-1].SLO})
			}
			xy = append(xy, plotter.XY{X: q.GPUHours, Y: 100 * q.SLO})
		}
		if n := len(front); n > 0 {
			xy = append(xy, plotter.XY{X: p.X.Max, Y: 100 * front[n-1].SLO})
		}
		return xy
	}
	entries := len(pipelines)
	for i, f := range []struct {
		name  string
		front []FrontierPoint
	}{{"static fleets (frontier)", static}, {"clairvoyant (frontier)", clairvoyant}} {
		if len(f.front) == 0 {
			continue
		}
		if err := line(p, steps(f.front), palette[i], f.name); err != nil {
			return err
		}
		entries++
	}
	for i, q := range pipelines {
		sc, err := plotter.NewScatter(plotter.XYs{{X: q.GPUHours, Y: 100 * q.SLO}})
		if err != nil {
			return err
		}
		sc.Color = palette[(i+2)%len(palette)]
		sc.Radius = vg.Points(4)
		sc.Shape = draw.CircleGlyph{}
		p.Add(sc)
		p.Legend.Add(q.Name, sc)
	}
	// The legend sits above 100 %, where no point or frontier can be: it
	// used to cover the points at the bottom right.
	p.Y.Min, p.Y.Max = 0, 100+legendRoom(entries)
	p.Legend.Top = true
	p.Legend.Left = false
	return saveSized([]*plot.Plot{p}, file, format, 1, 10*vg.Inch, 6*vg.Inch)
}

func minutes(r *sim.Report, i int) float64 { return float64(i) * r.Config.SampleSeconds / 60 }

func series(r *sim.Report, vals []float64) plotter.XYs {
	xy := make(plotter.XYs, 0, len(vals))
	for i, v := range vals {
		if v < 0 {
			continue // no value in that interval
		}
		xy = append(xy, plotter.XY{X: minutes(r, i), Y: v})
	}
	return xy
}

func ints(v []int) []float64 {
	out := make([]float64, len(v))
	for i, x := range v {
		out[i] = float64(x)
	}
	return out
}

func newPlot(r *sim.Report, title, y string) *plot.Plot {
	p := plot.New()
	p.X.Min, p.X.Max = 0, r.Config.HorizonSeconds/60
	p.Title.Text = title
	p.X.Label.Text = "minutes"
	p.Y.Label.Text = y
	p.Y.Min = 0
	p.Add(plotter.NewGrid())
	return p
}

func line(p *plot.Plot, xy plotter.XYs, c color.Color, name string) error {
	l, err := plotter.NewLine(xy)
	if err != nil {
		return err
	}
	l.Color = c
	l.Width = vg.Points(1.2)
	p.Add(l)
	if name != "" {
		p.Legend.Add(name, l)
	}
	return nil
}

// panels are one pipeline's four panels.
func panels(r *sim.Report, pr *sim.PipelineResult) []*plot.Plot {
	load := newPlot(r, fmt.Sprintf("%s: load (%s)", pr.Pipeline, r.Config.Trace), "requests/s")
	_ = line(load, series(r, r.ArrivalsPerSecond), palette[0], "")
	reps := newPlot(r, "replicas", "replicas")
	_ = line(reps, series(r, ints(pr.Series.Replicas)), palette[1], "all (starting, ready, terminating)")
	_ = line(reps, series(r, ints(pr.Series.Ready)), palette[2], "ready")
	reps.Legend.Top = true
	headroom(reps, 2)
	queue := newPlot(r, "queue", "requests waiting")
	_ = line(queue, series(r, ints(pr.Series.Waiting)), palette[3], "")
	ttft := newPlot(r, fmt.Sprintf("time to first token (SLO %gs)", r.Config.TTFTSLOSeconds), "seconds")
	_ = line(ttft, series(r, pr.Series.TTFTP50), palette[0], "p50")
	_ = line(ttft, series(r, pr.Series.TTFTP90), palette[4], "p90")
	ttft.Legend.Top = true
	headroom(ttft, 2)
	return []*plot.Plot{load, reps, queue, ttft}
}

// compare is the replica count of every pipeline over time.
func compare(r *sim.Report) (*plot.Plot, error) {
	p := newPlot(r, fmt.Sprintf("replicas by pipeline (%s, %s, %s)", r.Config.ScaledObject, r.Config.Profile, r.Config.Trace), "replicas")
	for i, pr := range r.Pipelines {
		if err := line(p, series(r, ints(pr.Series.Replicas)), palette[i%len(palette)], pr.Pipeline); err != nil {
			return nil, err
		}
	}
	p.Legend.Top = true
	headroom(p, len(r.Pipelines))
	return p, nil
}

// legendRoom is the share of an axis (in %) a legend of n entries takes at
// the plots' size, with a margin.
func legendRoom(n int) float64 { return 10 + 7*float64(n) }

// headroom raises the y axis so that a legend of n entries at the top sits
// above the curves instead of over them.
func headroom(p *plot.Plot, n int) {
	if p.Y.Max > p.Y.Min {
		p.Y.Max += (p.Y.Max - p.Y.Min) * legendRoom(n) / 100
	}
}

// save lays the plots out in one column.
func save(plots []*plot.Plot, file, format string, rows int) error {
	return saveSized(plots, file, format, rows, 10*vg.Inch, vg.Length(rows)*2.6*vg.Inch)
}

// saveSized lays the plots out in one column on a w × h canvas.
func saveSized(plots []*plot.Plot, file, format string, rows int, w, h vg.Length) error {
	var c draw.Canvas
	var png *vgimg.PngCanvas
	var svg *vgsvg.Canvas
	if format == "svg" {
		svg = vgsvg.New(w, h)
		c = draw.New(svg)
	} else {
		img := vgimg.New(w, h)
		png = &vgimg.PngCanvas{Canvas: img}
		c = draw.New(img)
	}
	t := draw.Tiles{Rows: rows, Cols: 1, PadX: vg.Millimeter, PadY: 2 * vg.Millimeter, PadTop: vg.Millimeter, PadBottom: vg.Millimeter,
		PadLeft: vg.Millimeter, PadRight: 2 * vg.Millimeter}
	for i, p := range plots {
		p.Draw(t.At(c, 0, i))
	}
	f, err := os.Create(file)
	if err != nil {
		return fmt.Errorf("write picture: %w", err)
	}
	if svg != nil {
		_, err = svg.WriteTo(f)
	} else {
		_, err = png.WriteTo(f)
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return fmt.Errorf("write picture %s: %w", file, err)
	}
	return nil
}
