// The kube-apiserver nodelb's end-to-end tests and benchmarks run against: upstream's own
// command (k8s.io/kubernetes/cmd/kube-apiserver), built from the pinned k8s.io/kubernetes module.
// It adds nothing; it only gives the Go toolchain a main package to build it from.
package main

import (
	"os"
	_ "time/tzdata"

	"k8s.io/component-base/cli"
	_ "k8s.io/component-base/logs/json/register"
	_ "k8s.io/component-base/metrics/prometheus/clientgo"
	_ "k8s.io/component-base/metrics/prometheus/version"
	"k8s.io/kubernetes/cmd/kube-apiserver/app"
)

func main() {
	os.Exit(cli.Run(app.NewAPIServerCommand()))
}
