package operator

import (
	"bufio"
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"sort"
	"sync"
	"time"
)

// Reconcile is one run of the reconciler over one ConfigMap, by one pod.
type Reconcile struct {
	Namespace string    `json:"namespace"`
	Name      string    `json:"name"`
	Pod       string    `json:"pod"`
	Start     time.Time `json:"start"`
	End       time.Time `json:"end"`
	// Outcome says what the run did with the object.
	Outcome Outcome `json:"outcome,omitempty"`
}

// Outcome of one reconcile.
type Outcome string

const (
	// OutcomeAbsent: the object was not in the pod's cache (deleted, or no
	// longer in the pod's shard), so the run did nothing.
	OutcomeAbsent Outcome = "absent"
	// OutcomeUnchanged: the object was already as wanted.
	OutcomeUnchanged Outcome = "unchanged"
	// OutcomeWritten: the run wrote the object.
	OutcomeWritten Outcome = "written"
	// OutcomeFailed: the run failed, for example because its write was
	// refused.
	OutcomeFailed Outcome = "failed"
)

// Recorder receives a record at the end of every reconcile. Implementations
// must be safe for concurrent use.
type Recorder interface {
	Record(Reconcile)
}

type nopRecorder struct{}

func (nopRecorder) Record(Reconcile) {}

// MemoryRecorder keeps records in memory, for tests. The zero value is ready
// to use and it is safe for concurrent use.
type MemoryRecorder struct {
	mu      sync.Mutex
	records []Reconcile
}

// Record appends r.
func (m *MemoryRecorder) Record(r Reconcile) {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.records = append(m.records, r)
}

// Records returns a snapshot of the records so far, in the order they were
// recorded.
func (m *MemoryRecorder) Records() []Reconcile {
	m.mu.Lock()
	defer m.mu.Unlock()
	return append([]Reconcile(nil), m.records...)
}

// FileRecorder appends records to a file as JSON lines, one object per line.
// Each record is written with a single write to a file opened in append mode,
// so several processes may append to their own files (or even to one file)
// without interleaving lines. Records are not buffered: a process that is
// killed loses no completed record.
type FileRecorder struct {
	mu   sync.Mutex
	f    *os.File
	path string
	err  error
}

// OpenFileRecorder opens path for appending, creating it if needed.
func OpenFileRecorder(path string) (*FileRecorder, error) {
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_APPEND|os.O_CREATE, 0o644)
	if err != nil {
		return nil, fmt.Errorf("opening the record file: %w", err)
	}
	return &FileRecorder{f: f, path: path}, nil
}

// Record appends r as one JSON line. Record has no error to return: the
// first failure is kept and returned by Err and Close, and later records are
// dropped, so that a file with a gap is never mistaken for a complete one.
func (f *FileRecorder) Record(r Reconcile) {
	line, err := json.Marshal(r)
	if err != nil {
		// Unreachable for this struct; kept as a recorded failure all the same.
		err = fmt.Errorf("encoding a record: %w", err)
	}
	line = append(line, '\n')
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.err != nil || f.f == nil {
		return
	}
	if err != nil {
		f.err = err
		return
	}
	if _, err := f.f.Write(line); err != nil {
		f.err = fmt.Errorf("appending to the record file %s: %w", f.path, err)
	}
}

// Err returns the first error Record met, if any.
func (f *FileRecorder) Err() error {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.err
}

// Close closes the file and returns the first error Record met or the
// error of closing. Records after Close are dropped.
func (f *FileRecorder) Close() error {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.f == nil {
		return f.err
	}
	closeErr := f.f.Close()
	f.f = nil
	if closeErr != nil {
		closeErr = fmt.Errorf("closing the record file %s: %w", f.path, closeErr)
	}
	return errors.Join(f.err, closeErr)
}

// ReadRecordFile reads a file written by FileRecorder. Blank lines are
// skipped; any other line that is not a record is an error naming the line.
func ReadRecordFile(path string) ([]Reconcile, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, fmt.Errorf("reading records: %w", err)
	}
	defer func() { _ = f.Close() }()

	var records []Reconcile
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 0, 64*1024), 1024*1024)
	for n := 1; sc.Scan(); n++ {
		line := bytes.TrimSpace(sc.Bytes())
		if len(line) == 0 {
			continue
		}
		var r Reconcile
		dec := json.NewDecoder(bytes.NewReader(line))
		dec.DisallowUnknownFields()
		if err := dec.Decode(&r); err != nil {
			return nil, fmt.Errorf("reading records: %s line %d: %w", path, n, err)
		}
		records = append(records, r)
	}
	if err := sc.Err(); err != nil {
		return nil, fmt.Errorf("reading records: %s: %w", path, err)
	}
	return records, nil
}

// Overlap is two reconciles of the same object by different pods whose
// [Start, End] intervals intersect: a double reconcile.
type Overlap struct {
	// A started no later than B.
	A, B Reconcile
}

func (o Overlap) String() string {
	return fmt.Sprintf("%s/%s reconciled by %s [%s, %s] and %s [%s, %s] at once",
		o.A.Namespace, o.A.Name,
		o.A.Pod, o.A.Start.Format(time.RFC3339Nano), o.A.End.Format(time.RFC3339Nano),
		o.B.Pod, o.B.Start.Format(time.RFC3339Nano), o.B.End.Format(time.RFC3339Nano))
}

// Overlaps finds every pair of records in which two different pods
// reconciled the same object (namespace and name) during intersecting closed
// intervals [Start, End]; intervals that merely touch count as intersecting.
// Overlaps of one pod with itself are not reported, nor records of runs that
// found the object absent from the pod's cache: such a run did no work on
// the object. The result is ordered by
// namespace, name, then the start of A and of B; it is nil when there is no
// overlap.
func Overlaps(records []Reconcile) []Overlap {
	type key struct{ namespace, name string }
	byObject := map[key][]Reconcile{}
	for _, r := range records {
		if r.Outcome == OutcomeAbsent {
			continue
		}
		k := key{r.Namespace, r.Name}
		byObject[k] = append(byObject[k], r)
	}
	keys := make([]key, 0, len(byObject))
	for k := range byObject {
		keys = append(keys, k)
	}
	sort.Slice(keys, func(i, j int) bool {
		if keys[i].namespace != keys[j].namespace {
			return keys[i].namespace < keys[j].namespace
		}
		return keys[i].name < keys[j].name
	})

	var out []Overlap
	for _, k := range keys {
		rs := byObject[k]
		sort.SliceStable(rs, func(i, j int) bool { return rs[i].Start.Before(rs[j].Start) })
		for i := range rs {
			// rs is sorted by start: once a later record starts after rs[i]
			// ends, so do all the ones after it.
			for j := i + 1; j < len(rs) && !rs[j].Start.After(rs[i].End); j++ {
				if rs[i].Pod != rs[j].Pod {
					out = append(out, Overlap{A: rs[i], B: rs[j]})
				}
			}
		}
	}
	return out
}
