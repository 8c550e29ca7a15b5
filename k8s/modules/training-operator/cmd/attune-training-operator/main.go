// Command attune-training-operator runs the Kubeflow training operator's PyTorchJob controller and its validating
// webhook (the library packages of github.com/kubeflow/training-operator v1.9.4) against a local control plane,
// within this project's network rule: every server it opens binds 127.0.0.1, and the only address it dials is the API
// server's, from the kubeconfig.
//
// Upstream's own command cannot be used as is: its webhook server listens on every interface (no flag changes that),
// and it keeps its serving certificate with cert-controller for the DNS name training-operator.kubeflow.svc, which an
// API server on 127.0.0.1 cannot resolve. Here the serving pair is given (--webhook-cert-dir holding tls.crt and
// tls.key, issued for IP 127.0.0.1 by whoever starts this), nothing rotates it, and whoever starts this registers the
// ValidatingWebhookConfiguration with a URL (https://127.0.0.1:<port>/validate-kubeflow-org-v1-pytorchjob).
// There is no leader election (one replica, a test's), no gang scheduling, and only the PyTorchJob kind.
//
// Exit status: 0 after SIGTERM/SIGINT, 1 when the manager fails, 2 for a bad flag (the message names it).
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"strconv"

	"k8s.io/apimachinery/pkg/runtime"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/healthz"
	"sigs.k8s.io/controller-runtime/pkg/log/zap"
	"sigs.k8s.io/controller-runtime/pkg/manager"
	metricsserver "sigs.k8s.io/controller-runtime/pkg/metrics/server"
	"sigs.k8s.io/controller-runtime/pkg/webhook"

	kubeflowv1 "github.com/kubeflow/training-operator/pkg/apis/kubeflow.org/v1"
	"github.com/kubeflow/training-operator/pkg/config"
	controllerv1 "github.com/kubeflow/training-operator/pkg/controller.v1"
	"github.com/kubeflow/training-operator/pkg/controller.v1/common"
	"github.com/kubeflow/training-operator/pkg/webhooks"
)

// loopback is the only address any server of this process listens on.
const loopback = "127.0.0.1"

// settings are the command line's values, checked by check before anything starts.
type settings struct {
	webhookPort, healthPort, metricsPort int
	certDir, namespace                   string
	threads                              int
}

func main() {
	s := settings{}
	flag.IntVar(&s.webhookPort, "webhook-port", 0, "port of the validating webhook's HTTPS server on 127.0.0.1 (required)")
	flag.StringVar(&s.certDir, "webhook-cert-dir", "",
		"folder holding the webhook's serving pair as tls.crt and tls.key (required; read as is, never rotated)")
	flag.IntVar(&s.healthPort, "health-port", 0,
		"port of /healthz and /readyz on 127.0.0.1; /readyz answers once the webhook server serves (0: off)")
	flag.IntVar(&s.metricsPort, "metrics-port", 0, "port of the Prometheus /metrics endpoint on 127.0.0.1 (0: off)")
	flag.StringVar(&s.namespace, "namespace", "", "watch PyTorchJobs in this namespace only (default: every namespace)")
	flag.IntVar(&s.threads, "controller-threads", 1, "PyTorchJobs reconciled at once")
	flag.StringVar(&config.Config.PyTorchInitContainerImage, "pytorch-init-container-image",
		config.PyTorchInitContainerImageDefault, "image of the init container that waits for the master (Worker pods)")
	config.Config.PyTorchInitContainerTemplateFile = config.PyTorchInitContainerTemplateFileDefault
	config.Config.PyTorchInitContainerMaxTries = config.PyTorchInitContainerMaxTriesDefault
	logOpts := zap.Options{Development: true}
	logOpts.BindFlags(flag.CommandLine)
	// --kubeconfig is controller-runtime's own flag (registered on flag.CommandLine); KUBECONFIG when it is not given
	flag.Parse()
	ctrl.SetLogger(zap.New(zap.UseFlagOptions(&logOpts)))

	if err := s.check(); err != nil {
		fmt.Fprintf(os.Stderr, "attune-training-operator: %v\n", err)
		os.Exit(2)
	}
	if err := run(s); err != nil {
		ctrl.Log.WithName("attune-training-operator").Error(err, "stopped")
		os.Exit(1)
	}
}

func (s settings) check() error {
	if flag.NArg() > 0 {
		return fmt.Errorf("unexpected argument %q: every setting is a flag (see -help)", flag.Arg(0))
	}
	ports := []struct {
		name     string
		value    int
		required bool
	}{{"--webhook-port", s.webhookPort, true}, {"--health-port", s.healthPort, false},
		{"--metrics-port", s.metricsPort, false}}
	for _, p := range ports {
		if p.value < 0 || p.value > 65535 || (p.required && p.value == 0) {
			return fmt.Errorf("%s=%d is not a port: give a free port between 1 and 65535 on 127.0.0.1", p.name, p.value)
		}
	}
	if s.certDir == "" {
		return errors.New("--webhook-cert-dir is required: a folder holding the serving pair as tls.crt and tls.key")
	}
	for _, name := range []string{"tls.crt", "tls.key"} {
		if _, err := os.Stat(filepath.Join(s.certDir, name)); err != nil {
			return fmt.Errorf("--webhook-cert-dir=%s has no readable %s (%v): issue a serving pair for IP 127.0.0.1 there",
				s.certDir, name, err)
		}
	}
	if s.threads < 1 {
		return fmt.Errorf("--controller-threads=%d: give at least 1", s.threads)
	}
	return nil
}

// address is host:port on the loopback interface, or "0" (controller-runtime's "off") for port 0.
func address(port int) string {
	if port == 0 {
		return "0"
	}
	return loopback + ":" + strconv.Itoa(port)
}

func run(s settings) error {
	scheme := runtime.NewScheme()
	if err := clientgoscheme.AddToScheme(scheme); err != nil {
		return err
	}
	if err := kubeflowv1.AddToScheme(scheme); err != nil {
		return err
	}
	cfg, err := ctrl.GetConfig()
	if err != nil {
		return fmt.Errorf("no API server credentials (--kubeconfig or KUBECONFIG): %w", err)
	}
	opts := ctrl.Options{
		Scheme:                 scheme,
		Metrics:                metricsserver.Options{BindAddress: address(s.metricsPort)},
		HealthProbeBindAddress: address(s.healthPort),
		LeaderElection:         false,
		WebhookServer: webhook.NewServer(webhook.Options{
			Host: loopback, Port: s.webhookPort, CertDir: s.certDir, CertName: "tls.crt", KeyName: "tls.key",
		}),
	}
	if s.namespace != "" {
		opts.Cache = cache.Options{DefaultNamespaces: map[string]cache.Config{s.namespace: {}}}
	}
	mgr, err := ctrl.NewManager(cfg, opts)
	if err != nil {
		return fmt.Errorf("cannot create the manager: %w", err)
	}

	// the PyTorchJob controller (it watches PyTorchJobs, their Pods and Services) and its validating webhook,
	// registered with the manager before it starts, so /readyz can only answer once both serve
	kind := kubeflowv1.PyTorchJobKind
	setupReconciler, ok := controllerv1.SupportedSchemeReconciler[kind]
	if !ok {
		return fmt.Errorf("the training operator library has no %s controller", kind)
	}
	if err := setupReconciler(mgr, common.GenNonGangSchedulerSetupFunc(), s.threads); err != nil {
		return fmt.Errorf("cannot set up the %s controller (is its CRD applied?): %w", kind, err)
	}
	setupWebhook, ok := webhooks.SupportedSchemeWebhook[kind]
	if !ok {
		return fmt.Errorf("the training operator library has no %s webhook", kind)
	}
	if err := setupWebhook(mgr); err != nil {
		return fmt.Errorf("cannot set up the %s webhook: %w", kind, err)
	}

	if err := mgr.AddHealthzCheck("ping", healthz.Ping); err != nil {
		return err
	}
	// ready = the webhook's TLS server accepts connections and the controllers run: the manager starts its
	// leader-election group (the controller and this runnable; with no election, at once) only after the informer
	// caches have listed what they watch
	running := make(chan struct{})
	if err := mgr.Add(manager.RunnableFunc(func(ctx context.Context) error {
		close(running)
		<-ctx.Done()
		return nil
	})); err != nil {
		return err
	}
	webhookStarted := mgr.GetWebhookServer().StartedChecker()
	if err := mgr.AddReadyzCheck("webhook-and-controller", func(req *http.Request) error {
		if err := webhookStarted(req); err != nil {
			return err
		}
		select {
		case <-running:
			return nil
		default:
			return errors.New("the informer caches have not synced yet")
		}
	}); err != nil {
		return err
	}
	return mgr.Start(ctrl.SetupSignalHandler())
}
