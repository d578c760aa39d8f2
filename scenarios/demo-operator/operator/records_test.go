package operator_test

import (
	"fmt"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"sync"
	"testing"
	"time"

	"k8s.io/utils/ptr"

	"github.com/ctrlmesh/ctrlmesh/scenarios/demo-operator/operator"
)

// at returns a time s seconds after a fixed origin.
func at(s float64) time.Time {
	return time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC).Add(time.Duration(s * float64(time.Second)))
}

func rec(ns, name, pod string, start, end float64) operator.Reconcile {
	return operator.Reconcile{Namespace: ns, Name: name, Pod: pod, Start: at(start), End: at(end)}
}

func TestOverlaps(t *testing.T) {
	tests := []struct {
		name    string
		records []operator.Reconcile
		want    []operator.Overlap
	}{
		{name: "no records"},
		{name: "one record", records: []operator.Reconcile{rec("ns", "a", "p1", 0, 1)}},
		{
			name: "two pods, one after the other",
			records: []operator.Reconcile{
				rec("ns", "a", "p1", 0, 1),
				rec("ns", "a", "p2", 1.5, 2),
			},
		},
		{
			name: "two pods at once",
			records: []operator.Reconcile{
				rec("ns", "a", "p1", 0, 2),
				rec("ns", "a", "p2", 1, 3),
			},
			want: []operator.Overlap{{A: rec("ns", "a", "p1", 0, 2), B: rec("ns", "a", "p2", 1, 3)}},
		},
		{
			name: "input out of order: A is the one that started first",
			records: []operator.Reconcile{
				rec("ns", "a", "p2", 1, 3),
				rec("ns", "a", "p1", 0, 2),
			},
			want: []operator.Overlap{{A: rec("ns", "a", "p1", 0, 2), B: rec("ns", "a", "p2", 1, 3)}},
		},
		{
			name: "touching ends count: the intervals are closed",
			records: []operator.Reconcile{
				rec("ns", "a", "p1", 0, 1),
				rec("ns", "a", "p2", 1, 2),
			},
			want: []operator.Overlap{{A: rec("ns", "a", "p1", 0, 1), B: rec("ns", "a", "p2", 1, 2)}},
		},
		{
			name: "one inside the other",
			records: []operator.Reconcile{
				rec("ns", "a", "p1", 0, 10),
				rec("ns", "a", "p2", 4, 5),
			},
			want: []operator.Overlap{{A: rec("ns", "a", "p1", 0, 10), B: rec("ns", "a", "p2", 4, 5)}},
		},
		{
			name: "same pod overlapping itself is not a double reconcile",
			records: []operator.Reconcile{
				rec("ns", "a", "p1", 0, 2),
				rec("ns", "a", "p1", 1, 3),
			},
		},
		{
			name: "different objects at once",
			records: []operator.Reconcile{
				rec("ns", "a", "p1", 0, 2),
				rec("ns", "b", "p2", 0, 2),
			},
		},
		{
			name: "same name in different namespaces",
			records: []operator.Reconcile{
				rec("ns1", "a", "p1", 0, 2),
				rec("ns2", "a", "p2", 0, 2),
			},
		},
		{
			name: "a long reconcile overlaps a later one past a short one in between",
			records: []operator.Reconcile{
				rec("ns", "a", "p1", 0, 10),
				rec("ns", "a", "p1", 1, 2),
				rec("ns", "a", "p2", 5, 6),
			},
			want: []operator.Overlap{
				{A: rec("ns", "a", "p1", 0, 10), B: rec("ns", "a", "p2", 5, 6)},
			},
		},
		{
			name: "three pods, every pair",
			records: []operator.Reconcile{
				rec("ns", "a", "p3", 2, 4),
				rec("ns", "a", "p1", 0, 5),
				rec("ns", "a", "p2", 1, 3),
			},
			want: []operator.Overlap{
				{A: rec("ns", "a", "p1", 0, 5), B: rec("ns", "a", "p2", 1, 3)},
				{A: rec("ns", "a", "p1", 0, 5), B: rec("ns", "a", "p3", 2, 4)},
				{A: rec("ns", "a", "p2", 1, 3), B: rec("ns", "a", "p3", 2, 4)},
			},
		},
		{
			name: "ordered by namespace then name",
			records: []operator.Reconcile{
				rec("ns2", "a", "p1", 0, 2),
				rec("ns2", "a", "p2", 1, 2),
				rec("ns1", "b", "p1", 0, 2),
				rec("ns1", "b", "p2", 1, 2),
				rec("ns1", "a", "p1", 5, 7),
				rec("ns1", "a", "p2", 6, 7),
			},
			want: []operator.Overlap{
				{A: rec("ns1", "a", "p1", 5, 7), B: rec("ns1", "a", "p2", 6, 7)},
				{A: rec("ns1", "b", "p1", 0, 2), B: rec("ns1", "b", "p2", 1, 2)},
				{A: rec("ns2", "a", "p1", 0, 2), B: rec("ns2", "a", "p2", 1, 2)},
			},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got := operator.Overlaps(tt.records)
			if !reflect.DeepEqual(got, tt.want) {
				t.Fatalf("Overlaps() =\n%v\nwant\n%v", got, tt.want)
			}
		})
	}
}

func TestOverlapString(t *testing.T) {
	o := operator.Overlap{A: rec("ns", "a", "p1", 0, 2), B: rec("ns", "a", "p2", 1, 3)}
	got := o.String()
	for _, want := range []string{"ns/a", "p1", "p2", "2026-01-01T00:00:01Z"} {
		if !strings.Contains(got, want) {
			t.Errorf("%q does not contain %q", got, want)
		}
	}
}

func TestMemoryRecorderIsSafeForConcurrentUse(t *testing.T) {
	var m operator.MemoryRecorder
	const writers, each = 8, 100
	var wg sync.WaitGroup
	for w := range writers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range each {
				m.Record(rec("ns", fmt.Sprint(i), fmt.Sprint("p", w), 0, 1))
				_ = m.Records()
			}
		}()
	}
	wg.Wait()
	got := m.Records()
	if len(got) != writers*each {
		t.Fatalf("got %d records, want %d", len(got), writers*each)
	}
	// A snapshot does not change under later records.
	m.Record(rec("ns", "late", "p", 0, 1))
	if len(got) != writers*each {
		t.Fatalf("a snapshot grew to %d records", len(got))
	}
}

// TestFileRecordersAppendWholeLines has several recorders (as several
// processes would) append at once to their own files and to one shared
// file, then reads every line back.
func TestFileRecordersAppendWholeLines(t *testing.T) {
	dir := t.TempDir()
	shared := filepath.Join(dir, "shared.jsonl")
	const pods, each = 4, 200
	var wg sync.WaitGroup
	for p := range pods {
		own, err := operator.OpenFileRecorder(filepath.Join(dir, fmt.Sprintf("pod-%d.jsonl", p)))
		if err != nil {
			t.Fatal(err)
		}
		sharedRec, err := operator.OpenFileRecorder(shared)
		if err != nil {
			t.Fatal(err)
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range each {
				r := operator.Reconcile{
					Namespace: "ns", Name: fmt.Sprint("cm-", i), Pod: fmt.Sprint("pod-", p),
					Start: time.Now(), End: time.Now(),
				}
				own.Record(r)
				sharedRec.Record(r)
			}
			for _, rc := range []*operator.FileRecorder{own, sharedRec} {
				if err := rc.Close(); err != nil {
					t.Error(err)
				}
			}
		}()
	}
	wg.Wait()

	for p := range pods {
		got, err := operator.ReadRecordFile(filepath.Join(dir, fmt.Sprintf("pod-%d.jsonl", p)))
		if err != nil {
			t.Fatal(err)
		}
		if len(got) != each {
			t.Fatalf("pod %d: read %d records, want %d", p, len(got), each)
		}
		for i, r := range got {
			if r.Pod != fmt.Sprint("pod-", p) || r.Name != fmt.Sprint("cm-", i) || r.Start.IsZero() {
				t.Fatalf("pod %d record %d = %+v", p, i, r)
			}
		}
	}
	got, err := operator.ReadRecordFile(shared)
	if err != nil {
		t.Fatal(err)
	}
	if len(got) != pods*each {
		t.Fatalf("shared file: read %d records, want %d", len(got), pods*each)
	}
}

func TestFileRecorderRoundTripsTimes(t *testing.T) {
	path := filepath.Join(t.TempDir(), "r.jsonl")
	fr, err := operator.OpenFileRecorder(path)
	if err != nil {
		t.Fatal(err)
	}
	want := []operator.Reconcile{rec("ns", "a", "p1", 0.000000001, 1.5), rec("ns", "b", "p2", 2, 3)}
	for _, r := range want {
		fr.Record(r)
	}
	if err := fr.Close(); err != nil {
		t.Fatal(err)
	}
	fr.Record(rec("ns", "after-close", "p1", 4, 5)) // dropped, no panic
	if err := fr.Err(); err != nil {
		t.Fatalf("Err() after Close = %v", err)
	}
	got, err := operator.ReadRecordFile(path)
	if err != nil {
		t.Fatal(err)
	}
	if len(got) != len(want) {
		t.Fatalf("read %d records, want %d", len(got), len(want))
	}
	for i := range want {
		if got[i].Namespace != want[i].Namespace || got[i].Name != want[i].Name || got[i].Pod != want[i].Pod ||
			!got[i].Start.Equal(want[i].Start) || !got[i].End.Equal(want[i].End) {
			t.Errorf("record %d = %+v, want %+v", i, got[i], want[i])
		}
	}
}

func TestReadRecordFileErrors(t *testing.T) {
	dir := t.TempDir()
	tests := []struct {
		name     string
		content  *string // nil: no file
		wantErr  string
		wantRecs int
	}{
		{name: "missing file", wantErr: "no such file"},
		{name: "empty file", content: ptr.To("")},
		{name: "blank lines skipped", content: ptr.To("\n" + `{"namespace":"ns","name":"a","pod":"p","start":"2026-01-01T00:00:00Z","end":"2026-01-01T00:00:01Z"}` + "\n\n"), wantRecs: 1},
		{name: "not JSON", content: ptr.To(`{"namespace":"ns","name":"a","pod":"p","start":"2026-01-01T00:00:00Z","end":"2026-01-01T00:00:01Z"}` + "\nnot json\n"), wantErr: "line 2"},
		{name: "unknown field", content: ptr.To(`{"namespace":"ns","nme":"a"}` + "\n"), wantErr: "line 1"},
		{name: "truncated line", content: ptr.To(`{"namespace":"ns","name":"a","pod":"p","start":"2026-01-01T00:00:00Z","end":"2026-01`), wantErr: "line 1"},
	}
	for i, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			path := filepath.Join(dir, fmt.Sprintf("%d.jsonl", i))
			if tt.content != nil {
				if err := os.WriteFile(path, []byte(*tt.content), 0o644); err != nil {
					t.Fatal(err)
				}
			}
			got, err := operator.ReadRecordFile(path)
			if tt.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
					t.Fatalf("ReadRecordFile() error = %v, want one containing %q", err, tt.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if len(got) != tt.wantRecs {
				t.Fatalf("read %d records, want %d", len(got), tt.wantRecs)
			}
		})
	}
}
