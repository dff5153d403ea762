// Command etcd is the upstream etcd server. etcd's own main module carries replace directives,
// so, as for Kubernetes, we wrap the library entry point.
package main

import (
	"os"

	"go.etcd.io/etcd/server/v3/etcdmain"
)

func main() {
	etcdmain.Main(os.Args)
}
