// Command netns-portal is test infrastructure of the e2e node (not part of Kubernetes): it opens
// listening sockets inside a pod's network namespace and forwards every connection to an address
// in the host's namespace, so a pod, whose network has no way to the host's, can reach a service the test
// runs on the host's 127.0.0.1 (the scripted model API, the API server) at 127.0.0.1:PORT of its
// own. No interface, route, address or firewall rule is added anywhere: the listener lives in the
// pod's namespace, the dialing socket in the host's, and the process copies bytes between them.
//
//	netns-portal --netns /path/to/netns [--pidfile FILE] 127.0.0.1:8090=127.0.0.1:26451 ...
//
// The e2e CNI plugin (e2e/node/cni/pod-net) starts one per pod on ADD and stops it on DEL, and
// `e2e/node up` one in the node's own network namespace (for kube-proxy).
package main

import (
	"flag"
	"fmt"
	"io"
	"log"
	"net"
	"os"
	"os/signal"
	"runtime"
	"strings"
	"sync"
	"syscall"

	"golang.org/x/sys/unix"
)

type portal struct{ listen, dial string }

func main() {
	netns := flag.String("netns", "", "network namespace file to listen in (e.g. /var/run/netns/x)")
	pidfile := flag.String("pidfile", "", "write our pid here")
	flag.Parse()
	if *netns == "" || flag.NArg() == 0 {
		fmt.Fprintln(os.Stderr, "usage: netns-portal --netns PATH [--pidfile FILE] LISTEN=DIAL ...")
		os.Exit(2)
	}
	var portals []portal
	for _, arg := range flag.Args() {
		l, d, ok := strings.Cut(arg, "=")
		if !ok || !strings.HasPrefix(l, "127.") || !strings.HasPrefix(d, "127.") {
			log.Fatalf("%q: want LISTEN=DIAL, both on 127.0.0.0/8", arg)
		}
		portals = append(portals, portal{l, d})
	}
	listeners, err := listenIn(*netns, portals)
	if err != nil {
		log.Fatal(err)
	}
	if *pidfile != "" {
		if err := os.WriteFile(*pidfile, []byte(fmt.Sprintf("%d\n", os.Getpid())), 0o644); err != nil {
			log.Fatal(err)
		}
	}
	for i, ln := range listeners {
		go serve(ln, portals[i].dial)
	}
	sigs := make(chan os.Signal, 1)
	signal.Notify(sigs, syscall.SIGTERM, syscall.SIGINT)
	<-sigs
}

// listenIn creates the listeners inside the namespace at path: the calling OS thread switches to
// it, binds, and switches back before any other goroutine can run on it.
func listenIn(path string, portals []portal) ([]net.Listener, error) {
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	self, err := os.Open(fmt.Sprintf("/proc/self/task/%d/ns/net", syscall.Gettid()))
	if err != nil {
		return nil, err
	}
	defer self.Close()
	target, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer target.Close()
	if err := setns(target); err != nil {
		return nil, fmt.Errorf("entering %s: %w", path, err)
	}
	var listeners []net.Listener
	for _, p := range portals {
		ln, lerr := net.Listen("tcp4", p.listen)
		if lerr != nil {
			err = fmt.Errorf("listening on %s in %s: %w", p.listen, path, lerr)
			break
		}
		listeners = append(listeners, ln)
	}
	if serr := setns(self); serr != nil {
		// The thread is stuck in the pod's namespace: never let it run anything else.
		log.Fatalf("returning to the host namespace: %v", serr)
	}
	return listeners, err
}

func setns(f *os.File) error { return unix.Setns(int(f.Fd()), unix.CLONE_NEWNET) }

func serve(ln net.Listener, dial string) {
	for {
		c, err := ln.Accept()
		if err != nil {
			log.Printf("accept on %s: %v", ln.Addr(), err)
			return
		}
		go func() {
			defer c.Close()
			d, err := net.Dial("tcp4", dial)
			if err != nil {
				log.Printf("%s -> %s: %v", ln.Addr(), dial, err)
				return
			}
			defer d.Close()
			var wg sync.WaitGroup
			wg.Add(1)
			go func() {
				defer wg.Done()
				io.Copy(d, c)
				if t, ok := d.(*net.TCPConn); ok {
					t.CloseWrite()
				}
			}()
			io.Copy(c, d)
			if t, ok := c.(*net.TCPConn); ok {
				t.CloseWrite()
			}
			wg.Wait()
		}()
	}
}
