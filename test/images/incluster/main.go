// Command incluster is the program of a test pod that talks to its API
// server as an operator in a real cluster does: rest.InClusterConfig (the
// kubernetes Service's KUBERNETES_SERVICE_HOST and _PORT, the pod's
// service-account token and the kube-root-ca.crt CA), nothing else. It
// reports the API server it was given, then GETs each API path of its
// arguments and reports one line per request:
//
//	host <the in-cluster config's host>
//	GET <path> <HTTP status> <the object's metadata.uid, or the error's message>
//
// on stdout and in its termination message (/dev/termination-log), which
// the test reads from the pod's status. With $INCLUSTER_CA_FILE set it
// verifies the server with that CA bundle instead of the in-cluster one
// (to show which server answers: the API server or a proxy). It exits 0
// when every request had
// an answer, whatever its status (the test judges them), and 1 when it
// could not ask (no in-cluster config, no connection, TLS refused).
package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"strings"
	"time"

	"k8s.io/client-go/rest"
)

func main() {
	report, err := run(os.Args[1:])
	fmt.Print(report)
	if err != nil {
		report += "error: " + err.Error() + "\n"
		fmt.Fprintln(os.Stderr, err)
	}
	// The kubelet reads it into the container's terminated state.
	_ = os.WriteFile("/dev/termination-log", []byte(report), 0o644)
	if err != nil {
		os.Exit(1)
	}
}

func run(paths []string) (string, error) {
	config, err := rest.InClusterConfig()
	if err != nil {
		return "", fmt.Errorf("in-cluster config: %w", err)
	}
	if ca := os.Getenv("INCLUSTER_CA_FILE"); ca != "" {
		config.TLSClientConfig.CAFile, config.TLSClientConfig.CAData = ca, nil
	}
	client, err := rest.HTTPClientFor(config)
	if err != nil {
		return "", fmt.Errorf("client: %w", err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	var report strings.Builder
	fmt.Fprintf(&report, "host %s\n", config.Host)
	for _, path := range paths {
		line, err := get(ctx, client, strings.TrimSuffix(config.Host, "/")+path)
		if err != nil {
			return report.String(), fmt.Errorf("GET %s: %w", path, err)
		}
		fmt.Fprintf(&report, "GET %s %s\n", path, line)
	}
	return report.String(), nil
}

// get returns the status of GET url and the object's uid or the Status's
// message.
func get(ctx context.Context, client *http.Client, url string) (string, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return "", err
	}
	req.Header.Set("Accept", "application/json")
	resp, err := client.Do(req)
	if err != nil {
		return "", err
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		return "", err
	}
	var object struct {
		Metadata struct {
			UID string `json:"uid"`
		} `json:"metadata"`
		Message string `json:"message"`
	}
	if err := json.Unmarshal(body, &object); err != nil {
		return "", fmt.Errorf("status %d, body not JSON: %w", resp.StatusCode, err)
	}
	detail := object.Metadata.UID
	if resp.StatusCode >= 300 {
		detail = object.Message
	}
	return fmt.Sprintf("%d %s", resp.StatusCode, detail), nil
}
