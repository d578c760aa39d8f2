package main

import (
	"encoding/json"
	"os"
	"time"
)

// record is a result as saved with -save and read back with -load, so that
// the curves and the table can join scales measured in separate runs (the
// largest runs once, late).
type record struct {
	Clusters, Configs, Pods, Works  int
	Ready                           time.Duration
	ReadyDone                       bool
	CPU                             float64
	RSS, Peak                       int64
	Requests                        map[string]float64
	SteadyWindow                    time.Duration
	Steady                          map[string]float64
	Heartbeats                      float64
	SteadyWorkWrites, SteadyEvents  int
	PodFailure                      time.Duration
	PodFailureWrites                []string
	RestartLeads, RestartHealed     time.Duration
	RestartWrites, RestartUnchanged []string
	RestartRSS                      int64
	FleetLoss                       time.Duration
	RestHeap, LeaderHeap            int64 `json:",omitempty"`
	Load                            string
	Ceiling                         *ceilingRecord     `json:",omitempty"`
	API                             *apiRecord         `json:",omitempty"`
	ReconcileErrors                 map[string]float64 `json:",omitempty"`
}

// apiRecord is an apiTraffic as saved.
type apiRecord struct {
	Writes, Conflicts, BodyBytes, WatchBytes map[string]float64
}

// ceilingRecord is a ceiling as saved.
type ceilingRecord struct {
	Works, Bytes               int
	Creates, Updates, Statuses float64
}

func toRecord(r *result, load string) record {
	return record{
		Clusters: r.clusters, Configs: r.configs, Pods: r.pods, Works: r.works, Ready: r.ready, ReadyDone: r.readyDone, CPU: r.cpu,
		RSS: r.rss, Peak: r.peak, Requests: r.requests, SteadyWindow: r.steadyWindow, Steady: r.steady, Heartbeats: r.heartbeatsPerSec,
		SteadyWorkWrites: r.steadyWorkWrites, SteadyEvents: r.steadyEvents, PodFailure: r.podFailure, PodFailureWrites: r.podFailureWrites,
		RestartLeads: r.restartLeads, RestartHealed: r.restartHealed, RestartWrites: r.restartWrites, RestartUnchanged: r.restartUnchanged,
		RestartRSS: r.restartRSS, FleetLoss: r.fleetLoss, RestHeap: r.restHeap, LeaderHeap: r.leaderHeap, Load: load, Ceiling: toCeilingRecord(r.ceiling),
		API: toAPIRecord(r.api), ReconcileErrors: r.reconcileErrors,
	}
}

func toCeilingRecord(c *ceiling) *ceilingRecord {
	if c == nil {
		return nil
	}
	return &ceilingRecord{Works: c.works, Bytes: c.bytes, Creates: c.creates, Updates: c.updates, Statuses: c.statuses}
}

func (c record) result() *result {
	return &result{
		scale: scale{clusters: c.Clusters, configs: c.Configs}, pods: c.Pods, works: c.Works, ready: c.Ready, readyDone: c.ReadyDone, cpu: c.CPU,
		rss: c.RSS, peak: c.Peak, requests: c.Requests, steadyWindow: c.SteadyWindow, steady: c.Steady, heartbeatsPerSec: c.Heartbeats,
		steadyWorkWrites: c.SteadyWorkWrites, steadyEvents: c.SteadyEvents, podFailure: c.PodFailure, podFailureWrites: c.PodFailureWrites,
		restartLeads: c.RestartLeads, restartHealed: c.RestartHealed, restartWrites: c.RestartWrites, restartUnchanged: c.RestartUnchanged,
		restartRSS: c.RestartRSS, fleetLoss: c.FleetLoss, restHeap: c.RestHeap, leaderHeap: c.LeaderHeap, ceiling: c.Ceiling.ceiling(),
		api: c.API.traffic(), reconcileErrors: c.ReconcileErrors,
	}
}

func (c *ceilingRecord) ceiling() *ceiling {
	if c == nil {
		return nil
	}
	return &ceiling{works: c.Works, bytes: c.Bytes, creates: c.Creates, updates: c.Updates, statuses: c.Statuses}
}

func toAPIRecord(t *apiTraffic) *apiRecord {
	if t == nil {
		return nil
	}
	return &apiRecord{Writes: t.writes, Conflicts: t.conflicts, BodyBytes: t.bodyBytes, WatchBytes: t.watchBytes}
}

func (c *apiRecord) traffic() *apiTraffic {
	if c == nil {
		return nil
	}
	return &apiTraffic{writes: c.Writes, conflicts: c.Conflicts, bodyBytes: c.BodyBytes, watchBytes: c.WatchBytes}
}

func save(path string, results []*result, load string) error {
	var out []record
	for _, r := range results {
		out = append(out, toRecord(r, load))
	}
	data, err := json.MarshalIndent(out, "", "  ")
	if err != nil {
		return err
	}
	return os.WriteFile(path, data, 0o644)
}

func load(path string) ([]*result, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	var in []record
	if err := json.Unmarshal(data, &in); err != nil {
		return nil, err
	}
	var out []*result
	for _, c := range in {
		out = append(out, c.result())
	}
	return out, nil
}
