// Command dashboardshot draws the stat panels of deploy/monitoring's
// Grafana dashboard, laid out by their gridPos, with values computed from
// one /metrics scrape of a hub, and screenshots the first row with
// chromium: the README's picture of the dashboard's main row, where no
// Grafana runs. It is not Grafana: it evaluates only the stat panels' query
// forms (an aggregation "max|sum by (...) (metric{...})", and
// histogram_quantile over a histogram's buckets) over the one scrape, so a
// quantile covers the hub's whole run rather than Grafana's time range.
//
//	CTRLMESH_METRICS_SCRAPE=/tmp/scrape.txt go test -run TestPlacementMapServedByHub ./hub
//	go run ./test/cmd/dashboardshot -scrape /tmp/scrape.txt -out docs/images/dashboard-main-row.png
package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"html"
	"math"
	"os"
	"os/exec"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/chromedp/chromedp"
	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
)

type panel struct {
	Type        string                   `json:"type"`
	Title       string                   `json:"title"`
	Description string                   `json:"description"`
	GridPos     struct{ H, W, X, Y int } `json:"gridPos"`
	Targets     []struct {
		Expr         string `json:"expr"`
		LegendFormat string `json:"legendFormat"`
	} `json:"targets"`
	FieldConfig struct {
		Defaults struct {
			Unit string `json:"unit"`
			// NoValue is what Grafana shows when the queries return no
			// series.
			NoValue    string `json:"noValue"`
			Thresholds struct {
				Steps []struct {
					Color string   `json:"color"`
					Value *float64 `json:"value"`
				} `json:"steps"`
			} `json:"thresholds"`
		} `json:"defaults"`
	} `json:"fieldConfig"`
}

var (
	aggregation = regexp.MustCompile(`^(max|sum) by \(([^)]*)\) \((\w+)(\{[^}]*\})?\)$`)
	quantile    = regexp.MustCompile(`^histogram_quantile\(([0-9.]+), sum by \(le\) \(rate\((\w+)_bucket\[[^\]]*\]\)\)\)$`)
	legendVar   = regexp.MustCompile(`\{\{(\w+)\}\}`)
)

type value struct {
	legend string
	v      float64
}

func evaluate(families map[string]*dto.MetricFamily, expr, legend string) ([]value, error) {
	if m := aggregation.FindStringSubmatch(expr); m != nil {
		by := strings.Split(strings.ReplaceAll(m[2], " ", ""), ",")
		// A vector without series is not in the scrape at all: no
		// values, as Prometheus answers; the caller shows noValue.
		f := families[m[3]]
		if f == nil {
			return nil, nil
		}
		groups := map[string]float64{}
		labels := map[string]map[string]string{}
		for _, s := range f.GetMetric() {
			ls := map[string]string{}
			for _, l := range s.GetLabel() {
				if slices.Contains(by, l.GetName()) {
					ls[l.GetName()] = l.GetValue()
				}
			}
			key := fmt.Sprint(ls)
			v := s.GetGauge().GetValue() + s.GetCounter().GetValue()
			prev, seen := groups[key]
			switch {
			case !seen:
				groups[key] = v
			case m[1] == "sum":
				groups[key] = prev + v
			default:
				groups[key] = math.Max(prev, v)
			}
			labels[key] = ls
		}
		var out []value
		for key, v := range groups {
			out = append(out, value{legendVar.ReplaceAllStringFunc(legend, func(s string) string { return labels[key][s[2:len(s)-2]] }), v})
		}
		slices.SortFunc(out, func(a, b value) int { return strings.Compare(a.legend, b.legend) })
		return out, nil
	}
	if m := quantile.FindStringSubmatch(expr); m != nil {
		q, _ := strconv.ParseFloat(m[1], 64)
		f := families[m[2]]
		if f == nil || len(f.GetMetric()) != 1 {
			return nil, fmt.Errorf("the scrape has no histogram %s", m[2])
		}
		h := f.GetMetric()[0].GetHistogram()
		return []value{{legend, histogramQuantile(q, h)}}, nil
	}
	return nil, fmt.Errorf("dashboardshot cannot evaluate %q", expr)
}

// histogramQuantile interpolates linearly within the bucket, as
// Prometheus' histogram_quantile does.
func histogramQuantile(q float64, h *dto.Histogram) float64 {
	total := float64(h.GetSampleCount())
	if total == 0 {
		return math.NaN()
	}
	rank, lower, below := q*total, 0.0, 0.0
	for _, b := range h.GetBucket() {
		count := float64(b.GetCumulativeCount())
		if count >= rank {
			return lower + (b.GetUpperBound()-lower)*(rank-below)/(count-below)
		}
		lower, below = b.GetUpperBound(), count
	}
	return lower
}

func color(p panel, v float64) string {
	c := "green"
	for _, s := range p.FieldConfig.Defaults.Thresholds.Steps {
		if s.Value == nil || v >= *s.Value {
			c = s.Color
		}
	}
	return map[string]string{"green": "#37872d", "red": "#c4162a", "orange": "#fa6400", "blue": "#1f60c4"}[c]
}

func format(p panel, v float64) string {
	if math.IsNaN(v) {
		return "–"
	}
	if p.FieldConfig.Defaults.Unit == "s" {
		return (time.Duration(v * float64(time.Second))).Round(10 * time.Millisecond).String()
	}
	return strconv.FormatFloat(v, 'f', -1, 64)
}

func main() {
	dashboard := flag.String("dashboard", "deploy/monitoring/ctrlmesh-dashboard.json", "the dashboard")
	scrape := flag.String("scrape", "", "a hub's /metrics, in the text format")
	out := flag.String("out", "dashboard.png", "the PNG to write")
	flag.Parse()
	if err := run(*dashboard, *scrape, *out); err != nil {
		fmt.Fprintln(os.Stderr, "dashboardshot:", err)
		os.Exit(1)
	}
}

func run(dashboardPath, scrapePath, out string) error {
	data, err := os.ReadFile(dashboardPath)
	if err != nil {
		return err
	}
	var d struct {
		Title  string  `json:"title"`
		Panels []panel `json:"panels"`
	}
	if err := json.Unmarshal(data, &d); err != nil {
		return err
	}
	f, err := os.Open(scrapePath)
	if err != nil {
		return err
	}
	defer func() { _ = f.Close() }()
	var parser expfmt.TextParser
	families, err := parser.TextToMetricFamilies(f)
	if err != nil {
		return fmt.Errorf("%s: %w", scrapePath, err)
	}
	var body strings.Builder
	// px per grid column; grid rows are 30px. The screenshot is of the
	// first row only: its title and its panels, 9 grid rows.
	const unit, firstRowHeight = 52, 9*30 + 20
	rows := map[int]string{}
	for _, p := range d.Panels {
		if p.Type == "row" {
			rows[p.GridPos.Y] = p.Title
			continue
		}
		if p.Type != "stat" {
			continue
		}
		var cells strings.Builder
		var all []value
		for _, t := range p.Targets {
			vs, err := evaluate(families, t.Expr, t.LegendFormat)
			if err != nil {
				return fmt.Errorf("panel %q: %w", p.Title, err)
			}
			all = append(all, vs...)
		}
		if len(all) == 0 {
			if p.FieldConfig.Defaults.NoValue == "" {
				return fmt.Errorf("panel %q: the scrape has no series of its queries and the panel no noValue to show", p.Title)
			}
			v, err := strconv.ParseFloat(p.FieldConfig.Defaults.NoValue, 64)
			if err != nil {
				return fmt.Errorf("panel %q: noValue %q: want a number: %w", p.Title, p.FieldConfig.Defaults.NoValue, err)
			}
			all = append(all, value{v: v})
		}
		for _, v := range all {
			fmt.Fprintf(&cells, `<div class="v" style="background:%s"><b>%s</b><span>%s</span></div>`, color(p, v.v), html.EscapeString(format(p, v.v)), html.EscapeString(v.legend))
		}
		fmt.Fprintf(&body, `<div class="p" style="left:%dpx;top:%dpx;width:%dpx;height:%dpx"><h3>%s</h3><div class="vs">%s</div></div>`,
			p.GridPos.X*unit, p.GridPos.Y*30, p.GridPos.W*unit-8, p.GridPos.H*30-8, html.EscapeString(p.Title), cells.String())
	}
	for y, title := range rows {
		fmt.Fprintf(&body, `<div class="row" style="top:%dpx">%s</div>`, y*30, html.EscapeString(title))
	}
	page := `<!doctype html><html><head><meta charset="utf-8"><style>
body{margin:0;background:#111217;font:13px system-ui,sans-serif;color:#ccccdc}
.wrap{position:relative;margin:10px}
.row{position:absolute;left:0;font-weight:600;font-size:14px;color:#d8d9da}
.p{position:absolute;background:#181b1f;border:1px solid #2c3235;border-radius:2px;padding:4px;box-sizing:border-box;overflow:hidden}
.p h3{margin:0 0 6px;font-size:12px;font-weight:500;color:#ccccdc}
.vs{display:flex;gap:4px;flex-wrap:wrap;height:calc(100% - 24px)}
.v{flex:1;min-width:45%;display:flex;flex-direction:column;justify-content:center;align-items:center;color:#fff;border-radius:2px}
.v b{font-size:34px;font-weight:500}.v span{font-size:11px;opacity:.9}
.note{position:absolute;left:10px;bottom:4px;font-size:11px;color:#8e8e8e}
</style></head><body><div class="wrap">` + body.String() + `</div></body></html>`
	tmp, err := os.CreateTemp("", "dashboardshot-*.html")
	if err != nil {
		return err
	}
	defer func() { _ = os.Remove(tmp.Name()) }()
	if _, err := tmp.WriteString(page); err != nil {
		return err
	}
	_ = tmp.Close()
	chromium, err := exec.LookPath("chromium")
	if err != nil {
		return fmt.Errorf("chromium not found: make browser-packages installs it")
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	alloc, cancelAlloc := chromedp.NewExecAllocator(ctx, chromedp.ExecPath(chromium), chromedp.Headless, chromedp.NoSandbox, chromedp.DisableGPU,
		chromedp.Flag("hide-scrollbars", true), chromedp.Flag("force-device-scale-factor", "1"))
	defer cancelAlloc()
	browser, cancelBrowser := chromedp.NewContext(alloc)
	defer cancelBrowser()
	if err := chromedp.Do(browser, chromedp.EmulateViewport(24*unit+20, firstRowHeight), chromedp.Navigate("file://"+tmp.Name())); err != nil {
		return err
	}
	shot, err := chromedp.Run(browser, chromedp.CaptureScreenshot())
	if err != nil {
		return err
	}
	return os.WriteFile(out, shot, 0o644)
}
