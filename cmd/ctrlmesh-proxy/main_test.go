package main

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/ctrlmesh/ctrlmesh/proxy"
	"github.com/ctrlmesh/ctrlmesh/proxy/redirect"
	"github.com/ctrlmesh/ctrlmesh/proxy/rules"
)

// writeKubeconfig writes a kubeconfig for server into dir.
func writeKubeconfig(t *testing.T, dir, name, server string) string {
	t.Helper()
	path := filepath.Join(dir, name)
	data := `apiVersion: v1
kind: Config
clusters: [{name: c, cluster: {server: "` + server + `"}}]
users: [{name: u, user: {token: t}}]
contexts: [{name: x, context: {cluster: c, user: u}}]
current-context: x
`
	if err := os.WriteFile(path, []byte(data), 0o600); err != nil {
		t.Fatal(err)
	}
	return path
}

func TestFlagsMapOntoOptions(t *testing.T) {
	dir := t.TempDir()
	hub := writeKubeconfig(t, dir, "hub", "https://hub.example:6443")
	member := writeKubeconfig(t, dir, "member", "https://member.example:6443")
	// What a run received, reduced to the parts the flags set.
	type received struct {
		upstream, rules, pod, namespace, rulesName, rulesFile, operatorKubeconfig string
		listen, health, webhookListen, webhookCertDir                             string
		webhookPeerPort                                                           int
		rulesFileInterval                                                         time.Duration
		mode                                                                      rules.Mode
	}
	tests := []struct {
		name    string
		env     map[string]string
		args    []string
		want    received
		wantErr string
	}{
		{
			name: "defaults, pod from the environment, rules from the upstream",
			env:  map[string]string{"POD_NAME": "op-0", "POD_NAMESPACE": "ops"},
			args: []string{"--upstream-kubeconfig", member, "--rules-name", "demo"},
			want: received{upstream: "https://member.example:6443", pod: "op-0", namespace: "ops", rulesName: "demo",
				listen: "127.0.0.1:15080", health: ":15081", rulesFileInterval: time.Second},
		},
		{
			name: "every flag; Fleet scope over the hub's objects",
			args: []string{"--upstream-kubeconfig", hub, "--rules-kubeconfig", member, "--pod-name", "op-1", "--pod-namespace", "team",
				"--rules-name", "demo", "--selector-mode", "range", "--listen-address", "127.0.0.1:9000", "--health-address", "",
				"--operator-kubeconfig", "/tmp/op.kubeconfig", "--webhook-listen-address", ":9443", "--webhook-peer-port", "9444",
				"--webhook-cert-dir", "/certs", "--rules-file-interval", "2s"},
			want: received{upstream: "https://hub.example:6443", rules: "https://member.example:6443", pod: "op-1", namespace: "team",
				rulesName: "demo", mode: rules.ModeRange, listen: "127.0.0.1:9000", operatorKubeconfig: "/tmp/op.kubeconfig",
				webhookListen: ":9443", webhookPeerPort: 9444, webhookCertDir: "/certs", rulesFileInterval: 2 * time.Second},
		},
		{
			name: "rules from a file need no namespace",
			args: []string{"--upstream-kubeconfig", member, "--pod-name", "op-0", "--rules-file", "/rules.yaml", "--selector-mode", "label"},
			want: received{upstream: "https://member.example:6443", pod: "op-0", rulesFile: "/rules.yaml", mode: rules.ModeLabel,
				listen: "127.0.0.1:15080", health: ":15081", rulesFileInterval: time.Second},
		},
		{name: "unknown selector mode", args: []string{"--upstream-kubeconfig", member, "--pod-namespace", "ops", "--rules-name", "demo", "--selector-mode", "ranges"},
			wantErr: `--selector-mode must be auto, range or label, not "ranges"`},
		{name: "no namespace for the ShardRoute", args: []string{"--upstream-kubeconfig", member, "--rules-name", "demo"},
			wantErr: `--pod-namespace (or POD_NAMESPACE) is needed to find the ShardRoute "demo"`},
		{name: "missing rules kubeconfig", args: []string{"--upstream-kubeconfig", member, "--rules-kubeconfig", filepath.Join(dir, "none"), "--pod-namespace", "ops", "--rules-name", "demo"},
			wantErr: "rules cluster credentials"},
		{name: "missing upstream kubeconfig", args: []string{"--upstream-kubeconfig", filepath.Join(dir, "none"), "--pod-namespace", "ops", "--rules-name", "demo"},
			wantErr: "upstream credentials"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			for _, k := range []string{"POD_NAME", "POD_NAMESPACE"} {
				t.Setenv(k, tt.env[k])
			}
			var got *proxy.Options
			cmd := newCommand(func(_ context.Context, o proxy.Options) error {
				got = &o
				return nil
			})
			err := cmd.execute(context.Background(), tt.args, &strings.Builder{}, &strings.Builder{})
			if tt.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
					t.Fatalf("error %v, want one containing %q", err, tt.wantErr)
				}
				if got != nil {
					t.Fatal("the proxy ran despite the error")
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if got == nil {
				t.Fatal("the proxy did not run")
			}
			r := received{upstream: got.Upstream.Host, pod: got.Pod, namespace: got.RulesNamespace, rulesName: got.RulesName,
				rulesFile: got.RulesFile, operatorKubeconfig: got.OperatorKubeconfig, listen: got.ListenAddress,
				health: got.HealthAddress, webhookListen: got.WebhookListenAddress, webhookCertDir: got.WebhookCertDir,
				webhookPeerPort: got.WebhookPeerPort, rulesFileInterval: got.RulesFileInterval, mode: got.Mode}
			if got.OwnCluster != nil {
				r.rules = got.OwnCluster.Host
			}
			if r != tt.want {
				t.Errorf("options =\n%+v\nwant\n%+v", r, tt.want)
			}
			if got.Log.GetSink() == nil {
				t.Error("no logger")
			}
		})
	}
}

// TestRunErrorIsReturned: the command fails when the proxy does.
func TestRunErrorIsReturned(t *testing.T) {
	member := writeKubeconfig(t, t.TempDir(), "member", "https://member.example:6443")
	cmd := newCommand(func(context.Context, proxy.Options) error { return errors.New("listen: address in use") })
	args := []string{"--upstream-kubeconfig", member, "--pod-name", "p", "--pod-namespace", "ops", "--rules-name", "demo"}
	if err := cmd.execute(context.Background(), args, &strings.Builder{}, &strings.Builder{}); err == nil || err.Error() != "listen: address in use" {
		t.Fatalf("error %v, want the proxy's", err)
	}
}

// TestHelpVersionAndArguments: --help and --version print and run nothing;
// positional arguments are refused.
func TestHelpVersionAndArguments(t *testing.T) {
	for _, tt := range []struct {
		args             []string
		wantOut, wantErr string
	}{
		{args: []string{"--help"}, wantOut: "--upstream-kubeconfig"},
		{args: []string{"--version"}, wantOut: "ctrlmesh-proxy version"},
		{args: []string{"extra"}, wantErr: "unexpected arguments: [extra]"},
		{args: []string{"--no-such-flag"}, wantErr: "unknown flag: --no-such-flag"},
	} {
		ran := false
		var stdout, stderr strings.Builder
		err := newCommand(func(context.Context, proxy.Options) error { ran = true; return nil }).execute(context.Background(), tt.args, &stdout, &stderr)
		if ran {
			t.Errorf("%v: the proxy ran", tt.args)
		}
		switch {
		case tt.wantErr != "" && (err == nil || !strings.Contains(err.Error(), tt.wantErr) || !strings.Contains(stderr.String(), tt.wantErr)):
			t.Errorf("%v: error %v (stderr %q), want %q", tt.args, err, stderr.String(), tt.wantErr)
		case tt.wantErr == "" && (err != nil || !strings.Contains(stdout.String(), tt.wantOut)):
			t.Errorf("%v: error %v, stdout %q, want it to contain %q", tt.args, err, stdout.String(), tt.wantOut)
		}
	}
}

// TestRedirectCommand: "ctrlmesh-proxy redirect" parses its destinations
// and applies them with its defaults; a destination that does not parse
// (the kubelet did not expand it) or a failed apply fails the command, so
// the init container fails and the pod does not start.
func TestRedirectCommand(t *testing.T) {
	applyErr := errors.New("netlink: operation not permitted")
	for _, tt := range []struct {
		name    string
		args    []string
		fail    bool
		want    string
		wantErr string
	}{
		{name: "defaults", args: []string{"redirect", "--destination=10.96.0.1:443", "--destination=10.245.0.1:6443"},
			want: "[10.96.0.1:443 10.245.0.1:6443] 15080 15080"},
		{name: "flags", args: []string{"redirect", "--destination=10.96.0.1:443", "--to-port=9000", "--exclude-uid=1337"},
			want: "[10.96.0.1:443] 9000 1337"},
		{name: "unexpanded", args: []string{"redirect", "--destination=$(KUBERNETES_SERVICE_HOST):$(KUBERNETES_SERVICE_PORT)"},
			wantErr: "is not an IP address"},
		{name: "port out of range", args: []string{"redirect", "--destination=10.96.0.1:443", "--to-port=70000"}, wantErr: "is not a port"},
		{name: "apply fails", args: []string{"redirect", "--destination=10.96.0.1:443"}, fail: true, wantErr: applyErr.Error()},
	} {
		t.Run(tt.name, func(t *testing.T) {
			var got string
			cmd, args := commandFor(tt.args, func(context.Context, proxy.Options) error { t.Fatal("the proxy ran"); return nil }, func(o redirect.Options) error {
				got = fmt.Sprint(o.Destinations, o.ToPort, o.ExcludeUserID)
				if tt.fail {
					return applyErr
				}
				return nil
			})
			err := cmd.execute(context.Background(), args, &strings.Builder{}, &strings.Builder{})
			if tt.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
					t.Fatalf("error %v, want one containing %q", err, tt.wantErr)
				}
				return
			}
			if err != nil || got != tt.want {
				t.Errorf("applied %q (%v), want %q", got, err, tt.want)
			}
		})
	}
}
