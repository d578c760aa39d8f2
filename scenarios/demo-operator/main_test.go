package main

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/spf13/pflag"
	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/ctrlmesh/ctrlmesh/scenarios/demo-operator/operator"
	"github.com/ctrlmesh/ctrlmesh/test/env"
)

// The API server for TestCommandRunsTheOperator, started only by it.
var (
	fleetOnce sync.Once
	fleet     *env.Fleet
	fleetErr  error
)

func TestMain(m *testing.M) {
	code := m.Run()
	if fleet != nil {
		if err := fleet.Stop(); err != nil {
			fmt.Fprintln(os.Stderr, err)
			if code == 0 {
				code = 1
			}
		}
	}
	os.Exit(code)
}

func member(t *testing.T) *env.Cluster {
	t.Helper()
	fleetOnce.Do(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
		defer cancel()
		fleet, fleetErr = env.Start(ctx, env.Options{Clusters: []env.ClusterSpec{{Name: "member"}}})
	})
	if fleetErr != nil {
		t.Fatal(fleetErr)
	}
	return fleet.Cluster("member")
}

func TestHelpDocumentsEveryFlag(t *testing.T) {
	// The flags that map onto operator.Options.
	documentedFlags := []string{
		"kubeconfig", "pod-name", "leader-election-id", "leader-election-namespace",
		"lease-duration", "renew-deadline", "retry-period", "webhook-port",
		"webhook-cert-dir", "health-addr", "metrics-addr", "record-file", "reconcile-delay",
		"kube-api-qps", "kube-api-burst",
	}
	cmd := newCommand(func(context.Context, operator.Options) error {
		return errors.New("--help must not run the operator")
	})
	var out bytes.Buffer
	cmd.SetOut(&out)
	cmd.SetErr(&out)
	cmd.SetArgs([]string{"--help"})
	if err := cmd.Execute(); err != nil {
		t.Fatal(err)
	}
	help := out.String()
	for _, name := range documentedFlags {
		if cmd.Flags().Lookup(name) == nil {
			t.Errorf("no --%s flag", name)
		}
	}
	cmd.Flags().VisitAll(func(f *pflag.Flag) {
		if f.Usage == "" {
			t.Errorf("--%s has no usage text", f.Name)
		}
		if !strings.Contains(help, "--"+f.Name) || !strings.Contains(help, firstWords(f.Usage)) {
			t.Errorf("--help does not document --%s (%q)", f.Name, f.Usage)
		}
	})
	for _, want := range []string{operator.ManagedLabel, operator.MutatePath, operator.ValidatePath} {
		if !strings.Contains(help, want) {
			t.Errorf("--help does not mention %s", want)
		}
	}
}

// firstWords is the start of a usage text, short enough not to be wrapped.
func firstWords(s string) string {
	words := strings.Fields(s)
	return strings.Join(words[:min(3, len(words))], " ")
}

// TestFlagsMapOntoOptions runs the command with a stand-in for operator.Run
// that captures the Options it is given.
func TestFlagsMapOntoOptions(t *testing.T) {
	dir := t.TempDir()
	kubeconfig := filepath.Join(dir, "kubeconfig")
	if err := os.WriteFile(kubeconfig, []byte(`apiVersion: v1
kind: Config
clusters: [{name: c, cluster: {server: "https://127.0.0.1:6443"}}]
users: [{name: u, user: {token: t}}]
contexts: [{name: x, context: {cluster: c, user: u}}]
current-context: x
`), 0o600); err != nil {
		t.Fatal(err)
	}
	recordFile := filepath.Join(dir, "records.jsonl")

	// comparable strips what cannot be compared with ==.
	type comparable struct {
		PodName, LeaderElectionID, LeaderElectionNamespace string
		LeaseDuration, RenewDeadline, RetryPeriod          time.Duration
		WebhookPort                                        int
		WebhookCertDir, HealthAddr, MetricsAddr            string
		ReconcileDelay                                     time.Duration
		QPS                                                float32
		Burst                                              int
	}
	tests := []struct {
		name         string
		env          map[string]string
		args         []string
		want         comparable
		wantRecorder bool
		wantErr      string
	}{
		{
			name: "defaults, names from the environment",
			env:  map[string]string{"POD_NAME": "pod-env", "POD_NAMESPACE": "ns-env"},
			args: []string{"--kubeconfig", kubeconfig},
			want: comparable{
				PodName: "pod-env", LeaderElectionID: "demo-operator", LeaderElectionNamespace: "ns-env",
				LeaseDuration: 15 * time.Second, RenewDeadline: 10 * time.Second, RetryPeriod: 2 * time.Second,
				WebhookPort: 9443, HealthAddr: ":8081", MetricsAddr: ":8080", QPS: 20, Burst: 30,
			},
		},
		{
			name: "every flag",
			env:  map[string]string{"POD_NAME": "pod-env", "POD_NAMESPACE": "ns-env"},
			args: []string{
				"--kubeconfig", kubeconfig, "--pod-name", "pod-1", "--leader-election-id", "lock",
				"--leader-election-namespace", "ops", "--lease-duration", "4s", "--renew-deadline", "3s",
				"--retry-period", "500ms", "--webhook-port", "10443", "--webhook-cert-dir", "/certs",
				"--health-addr", "127.0.0.1:9000", "--metrics-addr", "0", "--record-file", recordFile,
				"--reconcile-delay", "250ms", "--zap-log-level", "debug", "--kube-api-qps", "100", "--kube-api-burst", "200",
			},
			want: comparable{
				PodName: "pod-1", LeaderElectionID: "lock", LeaderElectionNamespace: "ops",
				LeaseDuration: 4 * time.Second, RenewDeadline: 3 * time.Second, RetryPeriod: 500 * time.Millisecond,
				WebhookPort: 10443, WebhookCertDir: "/certs", HealthAddr: "127.0.0.1:9000", MetricsAddr: "0",
				ReconcileDelay: 250 * time.Millisecond, QPS: 100, Burst: 200,
			},
			wantRecorder: true,
		},
		{name: "no pod name", env: map[string]string{"POD_NAMESPACE": "ns"}, args: []string{"--kubeconfig", kubeconfig}, wantErr: "--pod-name"},
		{name: "no namespace", env: map[string]string{"POD_NAME": "p"}, args: []string{"--kubeconfig", kubeconfig}, wantErr: "--leader-election-namespace"},
		{name: "missing kubeconfig", args: []string{"--pod-name", "p", "--leader-election-namespace", "ns", "--kubeconfig", filepath.Join(dir, "none")}, wantErr: "loading the client config"},
		{name: "bad duration", args: []string{"--lease-duration", "soon"}, wantErr: "invalid argument"},
		{name: "record file in a missing directory", args: []string{"--pod-name", "p", "--leader-election-namespace", "ns", "--kubeconfig", kubeconfig, "--record-file", filepath.Join(dir, "no", "such", "file")}, wantErr: "opening the record file"},
		{name: "positional argument", args: []string{"extra"}, wantErr: "unknown command"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Setenv("POD_NAME", tt.env["POD_NAME"])
			t.Setenv("POD_NAMESPACE", tt.env["POD_NAMESPACE"])
			var got *operator.Options
			cmd := newCommand(func(_ context.Context, o operator.Options) error {
				got = &o
				// The recorder must be usable while the operator runs.
				if o.Recorder != nil {
					o.Recorder.Record(operator.Reconcile{Namespace: "ns", Name: "probe", Pod: o.PodName, Start: time.Now(), End: time.Now()})
				}
				return nil
			})
			cmd.SetOut(io.Discard)
			cmd.SetErr(io.Discard)
			cmd.SetArgs(tt.args)
			err := cmd.Execute()
			if tt.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
					t.Fatalf("Execute() = %v, want an error containing %q", err, tt.wantErr)
				}
				if got != nil {
					t.Fatal("the operator ran despite the error")
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if got == nil {
				t.Fatal("the operator did not run")
			}
			c := comparable{
				PodName: got.PodName, LeaderElectionID: got.LeaderElectionID, LeaderElectionNamespace: got.LeaderElectionNamespace,
				LeaseDuration: got.LeaseDuration, RenewDeadline: got.RenewDeadline, RetryPeriod: got.RetryPeriod,
				WebhookPort: got.WebhookPort, WebhookCertDir: got.WebhookCertDir, HealthAddr: got.HealthAddr,
				MetricsAddr: got.MetricsAddr, ReconcileDelay: got.ReconcileDelay,
			}
			if got.Config != nil {
				c.QPS, c.Burst = got.Config.QPS, got.Config.Burst
			}
			if !reflect.DeepEqual(c, tt.want) {
				t.Errorf("Options =\n%+v\nwant\n%+v", c, tt.want)
			}
			if got.Config == nil || got.Config.Host != "https://127.0.0.1:6443" || got.Config.BearerToken != "t" {
				t.Errorf("Config from --kubeconfig = %+v", got.Config)
			}
			if got.Logger.GetSink() == nil {
				t.Error("no logger")
			}
			if (got.Recorder != nil) != tt.wantRecorder {
				t.Fatalf("Recorder = %v, want one: %v", got.Recorder, tt.wantRecorder)
			}
			if tt.wantRecorder {
				recs, err := operator.ReadRecordFile(recordFile)
				if err != nil {
					t.Fatal(err)
				}
				if len(recs) != 1 || recs[0].Pod != tt.want.PodName {
					t.Fatalf("records = %+v, want the probe of %s", recs, tt.want.PodName)
				}
			}
		})
	}
}

// TestCommandRunsTheOperator runs the whole command line against a real API
// server, as the demo will: kubeconfig file in, Lease, annotations, probes,
// metrics and a record file out.
func TestCommandRunsTheOperator(t *testing.T) {
	c := member(t)
	ctx := context.Background()
	ns := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{GenerateName: "cli-"}}
	if err := c.Client.Create(ctx, ns); err != nil {
		t.Fatal(err)
	}
	recordFile := filepath.Join(t.TempDir(), "pod-cli.jsonl")
	healthAddr, metricsAddr := freeAddr(t), freeAddr(t)
	const pod, lock = "pod-cli", "demo-operator-cli"

	runCtx, cancel := context.WithCancel(ctx)
	defer cancel()
	cmd := newCommand(operator.Run)
	cmd.SetArgs([]string{
		"--kubeconfig", c.KubeconfigPath, "--pod-name", pod,
		"--leader-election-id", lock, "--leader-election-namespace", ns.Name,
		"--lease-duration", "3s", "--renew-deadline", "2s", "--retry-period", "500ms",
		"--webhook-port", "0", "--health-addr", healthAddr, "--metrics-addr", metricsAddr,
		"--record-file", recordFile, "--reconcile-delay", "50ms",
	})
	done := make(chan error, 1)
	go func() { done <- cmd.ExecuteContext(runCtx) }()

	cm := &corev1.ConfigMap{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns.Name, Name: "from-cli", Labels: map[string]string{operator.ManagedLabel: operator.ManagedValue}},
		Data:       map[string]string{"k": "v"},
	}
	if err := c.Client.Create(ctx, cm); err != nil {
		t.Fatal(err)
	}
	poll(t, done, func() (bool, string) {
		var got corev1.ConfigMap
		if err := c.Client.Get(ctx, types.NamespacedName{Namespace: ns.Name, Name: "from-cli"}, &got); err != nil {
			return false, err.Error()
		}
		by := got.Annotations[operator.ReconciledByAnnotation]
		return by == pod && got.Annotations[operator.DataHashAnnotation] == operator.DataHash(&got), "reconciled-by " + by
	})
	var lease coordinationv1.Lease
	if err := c.Client.Get(ctx, types.NamespacedName{Namespace: ns.Name, Name: lock}, &lease); err != nil {
		t.Fatal(err)
	}
	if h := lease.Spec.HolderIdentity; h == nil || *h != pod {
		t.Fatalf("Lease holder = %v, want %s", h, pod)
	}
	for _, probe := range []struct{ url, want string }{
		{url: "http://" + healthAddr + "/healthz", want: "ok"},
		{url: "http://" + healthAddr + "/readyz", want: "ok"},
		{url: "http://" + metricsAddr + "/metrics", want: `controller_runtime_reconcile_total{controller="` + operator.ControllerName + `"`},
	} {
		poll(t, done, func() (bool, string) {
			body, err := get(probe.url)
			if err != nil {
				return false, err.Error()
			}
			return strings.Contains(body, probe.want), fmt.Sprintf("GET %s: no %q in %.200q", probe.url, probe.want, body)
		})
	}

	cancel()
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("the command ended with %v", err)
		}
	case <-time.After(time.Minute):
		t.Fatal("the command did not stop within a minute")
	}
	if err := c.Client.Get(ctx, types.NamespacedName{Namespace: ns.Name, Name: lock}, &lease); err != nil {
		t.Fatal(err)
	}
	if h := lease.Spec.HolderIdentity; h != nil && *h != "" {
		t.Errorf("Lease still held by %q after a clean stop, want released", *h)
	}
	recs, err := operator.ReadRecordFile(recordFile)
	if err != nil {
		t.Fatal(err)
	}
	// Shutdown cuts the delay of a reconcile in progress short, so only
	// some reconcile needs to have lasted the whole delay.
	var mine, delayed int
	for _, r := range recs {
		if r.Pod != pod {
			t.Errorf("record of another pod: %+v", r)
		}
		if r.Namespace == ns.Name && r.Name == "from-cli" {
			mine++
			if r.End.Sub(r.Start) >= 50*time.Millisecond {
				delayed++
			}
		}
	}
	if mine == 0 {
		t.Fatalf("no record of reconciling %s/from-cli in %s: %+v", ns.Name, recordFile, recs)
	}
	if delayed == 0 {
		t.Errorf("no reconcile of %s/from-cli lasted --reconcile-delay 50ms: %+v", ns.Name, recs)
	}
}

// poll waits up to 30 seconds for cond, failing early if the command ends.
func poll(t *testing.T, done <-chan error, cond func() (bool, string)) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for {
		ok, why := cond()
		if ok {
			return
		}
		select {
		case err := <-done:
			t.Fatalf("the command ended early with %v (waiting for: %s)", err, why)
		default:
		}
		if time.Now().After(deadline) {
			t.Fatalf("not after 30s: %s", why)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

func get(url string) (string, error) {
	client := &http.Client{Timeout: 2 * time.Second}
	resp, err := client.Get(url)
	if err != nil {
		return "", err
	}
	defer func() { _ = resp.Body.Close() }()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		return "", err
	}
	if resp.StatusCode != http.StatusOK {
		return "", fmt.Errorf("GET %s: %s: %s", url, resp.Status, body)
	}
	return string(body), nil
}

// freeAddr returns a loopback address whose port was free a moment ago.
func freeAddr(t *testing.T) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = l.Close() }()
	return l.Addr().String()
}
