// Command kube-proxy is the upstream kube-proxy, built from k8s.io/kubernetes as a Go module. The
// e2e node runs it inside its own network namespace (e2e/node), in iptables mode, so pods of the
// real node reach ClusterIP Services; nothing of it touches the host's namespace.
package main

import (
	"os"

	"k8s.io/component-base/cli"
	_ "k8s.io/component-base/logs/json/register"
	_ "k8s.io/component-base/metrics/prometheus/clientgo"
	_ "k8s.io/component-base/metrics/prometheus/version"
	"k8s.io/kubernetes/cmd/kube-proxy/app"
)

func main() {
	os.Exit(cli.Run(app.NewProxyCommand()))
}
