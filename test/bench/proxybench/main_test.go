package main

import (
	"errors"
	"flag"
	"io"
	"testing"
	"time"
)

func TestParseFlags(t *testing.T) {
	for _, tc := range []struct {
		name    string
		args    []string
		want    options // checked when wantErr is false
		wantErr bool
	}{
		{"defaults", nil, options{mode: "range", content: "protobuf", gets: 2000, lists: 20, events: 5000, writers: 8, replays: 5, clients: 64, concurrentFor: 10 * time.Second, rounds: 2, policies: 20, timeout: 20 * time.Minute}, false},
		{"label json", []string{"-mode=label", "-content=json", "-gets=10", "-cpuprofile=/tmp/x", "-proxy-cpuprofile=/tmp/p", "-policies=0"}, options{mode: "label", content: "json", gets: 10, lists: 20, events: 5000, writers: 8, replays: 5, clients: 64, concurrentFor: 10 * time.Second, rounds: 2, timeout: 20 * time.Minute, cpuProfile: "/tmp/x", proxyCPUProfile: "/tmp/p"}, false},
		{"too many policies", []string{"-policies=65"}, options{}, true},
		{"unknown mode", []string{"-mode=detect"}, options{}, true},
		{"unknown content", []string{"-content=cbor"}, options{}, true},
		{"no gets", []string{"-gets=0"}, options{}, true},
		{"too many events", []string{"-events=10001"}, options{}, true},
		{"stray argument", []string{"extra"}, options{}, true},
		{"zero timeout", []string{"-timeout=0s"}, options{}, true},
		{"no clients", []string{"-clients=0"}, options{}, true},
		{"zero concurrent duration", []string{"-concurrent-duration=0s"}, options{}, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := parseFlags(tc.args, io.Discard)
			if tc.wantErr {
				if err == nil {
					t.Fatalf("parseFlags(%v) accepted, want an error", tc.args)
				}
				return
			}
			if err != nil {
				t.Fatalf("parseFlags(%v): %v", tc.args, err)
			}
			if got != tc.want {
				t.Errorf("parseFlags(%v) = %+v, want %+v", tc.args, got, tc.want)
			}
		})
	}
	if _, err := parseFlags([]string{"-h"}, io.Discard); !errors.Is(err, flag.ErrHelp) {
		t.Errorf("-h: got %v, want flag.ErrHelp", err)
	}
}
