package main

import (
	"bytes"
	"io"
	"net/http/httptest"
	"runtime"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"
)

func TestMakeObjects(t *testing.T) {
	objs := makeObjects([]string{"a", "b", "c"}, 10, 256)
	if len(objs) != 10 {
		t.Fatalf("%d objects, want 10", len(objs))
	}
	seen := map[string]bool{}
	for _, o := range objs {
		if len(o.Data["config.yaml"]) != 256 {
			t.Errorf("%s/%s: payload of %d bytes, want 256", o.Namespace, o.Name, len(o.Data["config.yaml"]))
		}
		k := key(o.Namespace, o.Name)
		if seen[k] {
			t.Errorf("%s twice", k)
		}
		seen[k] = true
	}
}

func TestParseFlags(t *testing.T) {
	o, err := parseFlags(nil, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	if o.objects != 20000 || o.pods != 4 || o.edits != 20 || !o.karmada || !slices.Equal(o.phases, allPhases) {
		t.Errorf("defaults %+v do not match the issue's sizes", o)
	}
	if o.operatorQPS != 200 || o.operatorBurst() != 400 {
		t.Errorf("operator client limit %d/%d, want 200 QPS, burst 400", o.operatorQPS, o.operatorBurst())
	}
	if _, err := parseFlags([]string{"-operator-qps=0"}, io.Discard); err == nil {
		t.Error("-operator-qps=0 was accepted")
	}
	if _, err := parseFlags([]string{"-phases=memory,bogus"}, io.Discard); err == nil {
		t.Error("an unknown phase was accepted")
	}
	if _, err := parseFlags([]string{"-pods-per-member=1"}, io.Discard); err == nil {
		t.Error("one pod per member was accepted: a kill would leave no survivor")
	}
}

func TestParseProcStatus(t *testing.T) {
	const status = "Name:\tdemo-operator\nVmPeak:\t 1300000 kB\nVmHWM:\t   41640 kB\nVmRSS:\t   41000 kB\nRssAnon:\t   10812 kB\nRssFile:\t   30188 kB\nRssShmem:\t       0 kB\nThreads:\t12\n"
	tests := []struct {
		name    string
		data    string
		want    procMemory
		wantErr string
	}{
		{name: "all fields", data: status,
			want: procMemory{rss: 41000 * 1024, hwm: 41640 * 1024, anon: 10812 * 1024, file: 30188 * 1024}},
		{name: "no RssAnon and RssFile (kernel before 4.5)", data: "VmHWM:\t 1 kB\nVmRSS:\t 1 kB\n", wantErr: "no RssAnon, RssFile line"},
		{name: "not in kB", data: strings.Replace(status, "RssFile:\t   30188 kB", "RssFile:\t many", 1), wantErr: `line "RssFile:\t many"`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := parseProcStatus("/proc/1/status", []byte(tt.data))
			if tt.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
					t.Fatalf("error %v, want one containing %q", err, tt.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if got != tt.want {
				t.Errorf("got %+v, want %+v", got, tt.want)
			}
		})
	}
}

// TestReportEdits checks the edit section of the report on made-up samples:
// each fleet's percentiles, the Karmada / standalone ratio, each member's
// stages (differences of the times since the edit) and the goal rows.
func TestReportEdits(t *testing.T) {
	ms := func(n int) time.Duration { return time.Duration(n) * time.Millisecond }
	// sample makes an edit whose member1 and member2 stages are at the
	// given times (ms since the edit): work, route, enforced, reported.
	sample := func(m1, m2 [4]int) editSample {
		s := editSample{members: map[string]editStages{}}
		for i, st := range [][4]int{m1, m2} {
			m := latencyMembers[i]
			s.members[m] = editStages{work: ms(st[0]), route: ms(st[1]), enforced: ms(st[2]), reported: ms(st[3]), versions: 1}
			if e := ms(st[2]); e > s.total {
				s.total, s.slowest = e, m
			}
		}
		return s
	}
	standalone := &editResult{mode: modeStandalone, podsPerMember: 2, appliers: map[string]string{"member1": "ctrlmesh-agent", "member2": "ctrlmesh-agent"},
		samples: []editSample{sample([4]int{10, 30, 100, 120}, [4]int{10, 40, 90, 130}), sample([4]int{20, 50, 200, 260}, [4]int{20, 60, 150, 170})}}
	karmada := &editResult{mode: modeKarmada, podsPerMember: 2, appliers: map[string]string{"member1": "Karmada push", "member2": "Karmada pull"},
		samples: []editSample{sample([4]int{10, 110, 200, 1200}, [4]int{10, 80, 150, 900}), sample([4]int{20, 400, 600, 2000}, [4]int{20, 300, 400, 1400})}}

	// The second edit made the hub change member2's placement three times
	// more.
	st := karmada.samples[1].members["member2"]
	st.versions = 4
	karmada.samples[1].members["member2"] = st

	tests := []struct {
		name  string
		edits []*editResult
		want  []string
		never []string
	}{
		{
			name:  "standalone alone",
			edits: []*editResult{standalone},
			want: []string{
				"standalone, samples in edit order: 100 ms 200 ms",
				"standalone 2 100 ms 100 ms 200 ms 200 ms 150 ms",
				// member1: work 10/20, route-work 20/30, enforced-route 70/150, reported-enforced 20/60.
				"standalone member1 ctrlmesh-agent 10 ms / 20 ms 20 ms / 30 ms 70 ms / 150 ms 20 ms / 60 ms 100 ms / 200 ms 1",
				"edit -> every proxy enforcing, p99, standalone <= 1000 ms 200 ms PASS",
				"route versions per edit and member, standalone 1 1 PASS",
			},
			never: []string{"same run", "p99, Karmada", "Karmada,"},
		},
		{
			name:  "both fleets",
			edits: []*editResult{standalone, karmada},
			want: []string{
				"on 2 fleets running at once (standalone, Karmada)",
				"Karmada, samples in edit order: 200 ms 600 ms",
				"Karmada / standalone, same run: p50 2.00x, p99 3.00x",
				// member2: work 10/20, route-work 70/280, enforced-route 70/100, reported-enforced 750/1000.
				"Karmada member2 Karmada pull 10 ms / 20 ms 70 ms / 280 ms 70 ms / 100 ms 750 ms / 1000 ms 150 ms / 400 ms 4",
				"edit -> every proxy enforcing, p99, standalone <= 1000 ms 200 ms PASS",
				"edit -> every proxy enforcing, p99, Karmada <= 1500 ms 600 ms PASS",
				"route versions per edit and member, standalone 1 1 PASS",
				"route versions per edit and member, Karmada 1 4 MISS",
			},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var out bytes.Buffer
			report(&out, options{operatorQPS: 200}, &results{edits: tt.edits})
			// The table's columns are padded: compare with single spaces.
			var lines []string
			for _, l := range strings.Split(out.String(), "\n") {
				lines = append(lines, strings.Join(strings.Fields(l), " "))
			}
			text := strings.Join(lines, "\n")
			for _, w := range tt.want {
				if !strings.Contains(text, w) {
					t.Errorf("the report has no line with %q:\n%s", w, text)
				}
			}
			for _, n := range tt.never {
				if strings.Contains(text, n) {
					t.Errorf("the report mentions %q:\n%s", n, text)
				}
			}
		})
	}
}

// TestReadGoMemory reads the runtime's memory from a registry built as
// controller-runtime builds its own (every runtime/metrics series): the
// names readGoMemory needs are served, and the figures are consistent.
func TestReadGoMemory(t *testing.T) {
	reg := prometheus.NewRegistry()
	reg.MustRegister(collectors.NewGoCollector(collectors.WithGoCollectorRuntimeMetrics(collectors.MetricsAll)))
	runtime.GC() // a collection has marked a live heap
	srv := httptest.NewServer(promhttp.HandlerFor(reg, promhttp.HandlerOpts{}))
	defer srv.Close()

	m, err := readGoMemory(t.Context(), strings.TrimPrefix(srv.URL, "http://"))
	if err != nil {
		t.Fatal(err)
	}
	if m.live <= 0 || m.goal < m.live || m.heap < m.live {
		t.Errorf("inconsistent Go memory %+v: want 0 < live <= goal, live <= heap", m)
	}

	empty := httptest.NewServer(promhttp.HandlerFor(prometheus.NewRegistry(), promhttp.HandlerOpts{}))
	defer empty.Close()
	if _, err := readGoMemory(t.Context(), strings.TrimPrefix(empty.URL, "http://")); err == nil || !strings.Contains(err.Error(), "go_gc_heap_live_bytes") {
		t.Errorf("an endpoint without the Go collector: error %v, want one naming go_gc_heap_live_bytes", err)
	}
}
