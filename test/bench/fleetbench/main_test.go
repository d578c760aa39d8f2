package main

import (
	"io"
	"slices"
	"strings"
	"testing"
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
	if o.objects != 20000 || o.pods != 4 || o.edits != 20 || !slices.Equal(o.phases, allPhases) {
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
