// Command etcd runs etcd's own entry point, compiled from the version of
// go.etcd.io/etcd/server/v3 that the Kubernetes module graph selects.
package main

import (
	"os"

	"go.etcd.io/etcd/server/v3/etcdmain"
)

func main() {
	etcdmain.Main(os.Args)
}
