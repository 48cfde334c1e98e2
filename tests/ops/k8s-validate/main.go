// k8s-validate checks rendered Kubernetes manifests offline, against the API's own Go types: the
// types the API server's OpenAPI schemas are generated from (k8s.io/api, the release helm links)
// and the Prometheus Operator's types for ServiceMonitor, PodMonitor and PrometheusRule.
//
//	k8s-validate FILE...   (multi-document YAML; "-" reads stdin)
//
// Each document must be of a kind the scheme knows (an unknown apiVersion/kind is an error) and
// decode strictly: an unknown or duplicate field, or a value of the wrong type, is an error. Then
// the fields the types mark as required (a json tag without omitempty/omitzero) must be there,
// metadata must pass the API server's ObjectMeta validation (names, labels, annotations), and pod
// templates get the API server's cheapest checks (names of containers, ports and variables;
// probes and mounts that name a port or volume that exists; a selector that matches). What it does
// not do: defaulting, the full per-field validation of the API server, admission.
//
// Prints "ok: KIND NAME" per document, or each error; exits 1 if any document failed, 2 on usage.
package main

import (
	"bufio"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"reflect"
	"regexp"
	"strings"

	monitoringv1 "github.com/prometheus-operator/prometheus-operator/pkg/apis/monitoring/v1"
	appsv1 "k8s.io/api/apps/v1"
	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	apivalidation "k8s.io/apimachinery/pkg/api/validation"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	metav1validation "k8s.io/apimachinery/pkg/apis/meta/v1/validation"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	kjson "k8s.io/apimachinery/pkg/runtime/serializer/json"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/apimachinery/pkg/util/validation"
	"k8s.io/apimachinery/pkg/util/validation/field"
	utilyaml "k8s.io/apimachinery/pkg/util/yaml"
	"k8s.io/client-go/kubernetes/scheme"
	"sigs.k8s.io/yaml"
)

// Kinds without a namespace; every other kind must name one (the chart's templates set it).
var clusterScoped = map[string]bool{
	"Namespace": true, "ClusterRole": true, "ClusterRoleBinding": true, "PersistentVolume": true,
	"StorageClass": true, "PriorityClass": true, "CustomResourceDefinition": true,
}

// The Prometheus Operator's CRDs restrict its Duration fields to this pattern.
var monitoringDuration = regexp.MustCompile(
	`^(0|(([0-9]+)y)?(([0-9]+)w)?(([0-9]+)d)?(([0-9]+)h)?(([0-9]+)m)?(([0-9]+)s)?(([0-9]+)ms)?)$`)

func main() {
	if len(os.Args) < 2 {
		fmt.Fprintln(os.Stderr, "usage: k8s-validate FILE... (multi-document YAML; - for stdin)")
		os.Exit(2)
	}
	s := runtime.NewScheme()
	if err := scheme.AddToScheme(s); err != nil {
		panic(err)
	}
	if err := monitoringv1.AddToScheme(s); err != nil {
		panic(err)
	}
	decoder := kjson.NewSerializerWithOptions(kjson.DefaultMetaFactory, s, s, kjson.SerializerOptions{Strict: true})
	failed := 0
	documents := 0
	for _, path := range os.Args[1:] {
		docs, err := readDocuments(path)
		if err != nil {
			fmt.Printf("FAIL: %s: %v\n", path, err)
			failed++
			continue
		}
		for i, doc := range docs {
			documents++
			what, errs := check(s, decoder, doc)
			if len(errs) == 0 {
				fmt.Printf("ok: %s\n", what)
				continue
			}
			failed++
			fmt.Printf("FAIL: %s (%s, document %d)\n", what, path, i+1)
			for _, e := range errs {
				fmt.Printf("    %s\n", e)
			}
		}
	}
	if documents == 0 {
		fmt.Println("FAIL: no documents")
		os.Exit(1)
	}
	if failed > 0 {
		fmt.Printf("%d of %d documents failed\n", failed, documents)
		os.Exit(1)
	}
	fmt.Printf("%d documents valid\n", documents)
}

// readDocuments splits a multi-document YAML file, leaving out documents that are empty or only
// comments (helm template prints those for templates switched off).
func readDocuments(path string) ([][]byte, error) {
	var in io.Reader = os.Stdin
	if path != "-" {
		f, err := os.Open(path)
		if err != nil {
			return nil, err
		}
		defer f.Close()
		in = f
	}
	reader := utilyaml.NewYAMLReader(bufio.NewReader(in))
	var docs [][]byte
	for {
		doc, err := reader.Read()
		if errors.Is(err, io.EOF) {
			return docs, nil
		}
		if err != nil {
			return nil, err
		}
		var probe map[string]any
		if err := yaml.Unmarshal(doc, &probe); err == nil && len(probe) == 0 {
			continue
		}
		docs = append(docs, doc)
	}
}

func check(s *runtime.Scheme, decoder runtime.Decoder, doc []byte) (string, []string) {
	// YAMLToJSONStrict refuses duplicate keys, which a plain YAML decode would let the last win.
	data, err := yaml.YAMLToJSONStrict(doc)
	if err != nil {
		return "document", []string{err.Error()}
	}
	var raw map[string]any
	if err := json.Unmarshal(data, &raw); err != nil {
		return "document", []string{"not a mapping: " + err.Error()}
	}
	var meta struct {
		APIVersion string            `json:"apiVersion"`
		Kind       string            `json:"kind"`
		Metadata   metav1.ObjectMeta `json:"metadata"`
	}
	if err := json.Unmarshal(data, &meta); err != nil {
		return "document", []string{err.Error()}
	}
	what := fmt.Sprintf("%s %s", meta.Kind, meta.Metadata.Name)
	gv, err := schema.ParseGroupVersion(meta.APIVersion)
	if err != nil || meta.Kind == "" {
		return what, []string{fmt.Sprintf("apiVersion %q / kind %q: not a Kubernetes object", meta.APIVersion, meta.Kind)}
	}
	if !s.Recognizes(gv.WithKind(meta.Kind)) {
		return what, []string{fmt.Sprintf("%s %s: a kind this validator does not know "+
			"(not in k8s.io/api or monitoring.coreos.com/v1)", meta.APIVersion, meta.Kind)}
	}
	obj, _, err := decoder.Decode(data, nil, nil)
	if err != nil {
		// A strict decoding error lists every unknown or duplicate field.
		return what, strings.Split(err.Error(), ", ")
	}
	var errs []string
	required(nil, raw, reflect.TypeOf(obj).Elem(), &errs)

	nameFn := apivalidation.NameIsDNSSubdomain
	if meta.Kind == "Service" {
		nameFn = apivalidation.NameIsDNS1035Label
	}
	namespaced := !clusterScoped[meta.Kind]
	for _, e := range apivalidation.ValidateObjectMeta(&meta.Metadata, namespaced, nameFn, field.NewPath("metadata")) {
		errs = append(errs, e.Error())
	}
	errs = append(errs, semantics(obj)...)
	return what, errs
}

var unmarshaler = reflect.TypeOf((*json.Unmarshaler)(nil)).Elem()

// required walks the document beside its Go type: a struct field whose json tag has neither
// omitempty nor omitzero is required (the rule the OpenAPI generator applies), and every value
// of the Prometheus Operator's Duration type must match the CRD's pattern.
func required(path *field.Path, raw any, t reflect.Type, errs *[]string) {
	for t.Kind() == reflect.Pointer {
		t = t.Elem()
	}
	if t == reflect.TypeOf(monitoringv1.Duration("")) {
		if v, ok := raw.(string); ok && !monitoringDuration.MatchString(v) {
			*errs = append(*errs, fmt.Sprintf("%s: %q is not a duration such as 30s or 1m30s", path, v))
		}
		return
	}
	// Types with their own decoding (IntOrString, Quantity, Time, RawExtension...) are leaves.
	if reflect.PointerTo(t).Implements(unmarshaler) || t == reflect.TypeOf(intstr.IntOrString{}) {
		return
	}
	switch t.Kind() {
	case reflect.Struct:
		m, ok := raw.(map[string]any)
		if !ok {
			return
		}
		for i := 0; i < t.NumField(); i++ {
			f := t.Field(i)
			tag := f.Tag.Get("json")
			if tag == "-" || !f.IsExported() {
				continue
			}
			name, opts, _ := strings.Cut(tag, ",")
			if name == "" && (f.Anonymous || strings.Contains(opts, "inline")) {
				required(path, raw, f.Type, errs)
				continue
			}
			if name == "" {
				name = f.Name
			}
			v, present := m[name]
			if !present {
				if !strings.Contains(opts, "omitempty") && !strings.Contains(opts, "omitzero") {
					*errs = append(*errs, fmt.Sprintf("%s: required field missing", path.Child(name)))
				}
				continue
			}
			required(path.Child(name), v, f.Type, errs)
		}
	case reflect.Slice:
		if items, ok := raw.([]any); ok && t.Elem().Kind() != reflect.Uint8 {
			for i, item := range items {
				required(path.Index(i), item, t.Elem(), errs)
			}
		}
	case reflect.Map:
		if m, ok := raw.(map[string]any); ok {
			for k, v := range m {
				required(path.Key(k), v, t.Elem(), errs)
			}
		}
	}
}

// semantics: a few checks of the API server's validation that need no cluster.
func semantics(obj runtime.Object) []string {
	var errs field.ErrorList
	podTemplate := func(path *field.Path, selector *metav1.LabelSelector, tpl *corev1.PodTemplateSpec) {
		errs = append(errs, metav1validation.ValidateLabels(tpl.Labels, path.Child("metadata", "labels"))...)
		errs = append(errs, apivalidation.ValidateAnnotations(tpl.Annotations, path.Child("metadata", "annotations"))...)
		if selector != nil {
			errs = append(errs, selectorMatches(field.NewPath("spec", "selector"), selector, tpl.Labels)...)
		}
		errs = append(errs, podSpec(path.Child("spec"), &tpl.Spec)...)
	}
	switch o := obj.(type) {
	case *appsv1.Deployment:
		podTemplate(field.NewPath("spec", "template"), o.Spec.Selector, &o.Spec.Template)
	case *appsv1.StatefulSet:
		podTemplate(field.NewPath("spec", "template"), o.Spec.Selector, &o.Spec.Template)
	case *appsv1.DaemonSet:
		podTemplate(field.NewPath("spec", "template"), o.Spec.Selector, &o.Spec.Template)
	case *batchv1.Job:
		podTemplate(field.NewPath("spec", "template"), nil, &o.Spec.Template)
		if p := o.Spec.Template.Spec.RestartPolicy; p != corev1.RestartPolicyNever && p != corev1.RestartPolicyOnFailure {
			errs = append(errs, field.NotSupported(field.NewPath("spec", "template", "spec", "restartPolicy"), p,
				[]string{string(corev1.RestartPolicyNever), string(corev1.RestartPolicyOnFailure)}))
		}
	case *monitoringv1.ServiceMonitor:
		errs = append(errs, labelSelector(&o.Spec.Selector)...)
	case *monitoringv1.PodMonitor:
		errs = append(errs, labelSelector(&o.Spec.Selector)...)
	}
	out := make([]string, 0, len(errs))
	for _, e := range errs {
		out = append(out, e.Error())
	}
	return out
}

func labelSelector(selector *metav1.LabelSelector) field.ErrorList {
	return metav1validation.ValidateLabelSelector(selector, metav1validation.LabelSelectorValidationOptions{},
		field.NewPath("spec", "selector"))
}

func selectorMatches(path *field.Path, selector *metav1.LabelSelector, podLabels map[string]string) field.ErrorList {
	errs := metav1validation.ValidateLabelSelector(selector, metav1validation.LabelSelectorValidationOptions{}, path)
	sel, err := metav1.LabelSelectorAsSelector(selector)
	if err != nil {
		return append(errs, field.Invalid(path, selector, err.Error()))
	}
	if sel.Empty() || !sel.Matches(labels.Set(podLabels)) {
		errs = append(errs, field.Invalid(path, selector, "selector does not match the template's labels"))
	}
	return errs
}

func podSpec(path *field.Path, spec *corev1.PodSpec) field.ErrorList {
	var errs field.ErrorList
	volumes := map[string]bool{}
	for i, v := range spec.Volumes {
		p := path.Child("volumes").Index(i)
		errs = append(errs, dnsLabel(p.Child("name"), v.Name)...)
		if volumes[v.Name] {
			errs = append(errs, field.Duplicate(p.Child("name"), v.Name))
		}
		volumes[v.Name] = true
	}
	names := map[string]bool{}
	containers := func(kind string, list []corev1.Container) {
		for i := range list {
			c := &list[i]
			p := path.Child(kind).Index(i)
			errs = append(errs, dnsLabel(p.Child("name"), c.Name)...)
			if names[c.Name] {
				errs = append(errs, field.Duplicate(p.Child("name"), c.Name))
			}
			names[c.Name] = true
			if c.Image == "" {
				errs = append(errs, field.Required(p.Child("image"), ""))
			}
			ports := map[string]bool{}
			for j, port := range c.Ports {
				if port.Name == "" {
					continue
				}
				for _, msg := range validation.IsValidPortName(port.Name) {
					errs = append(errs, field.Invalid(p.Child("ports").Index(j).Child("name"), port.Name, msg))
				}
				ports[port.Name] = true
			}
			for j, e := range c.Env {
				for _, msg := range validation.IsEnvVarName(e.Name) {
					errs = append(errs, field.Invalid(p.Child("env").Index(j).Child("name"), e.Name, msg))
				}
			}
			for j, m := range c.VolumeMounts {
				if !volumes[m.Name] {
					errs = append(errs, field.NotFound(p.Child("volumeMounts").Index(j).Child("name"), m.Name))
				}
			}
			probes := map[string]*corev1.Probe{
				"livenessProbe": c.LivenessProbe, "readinessProbe": c.ReadinessProbe, "startupProbe": c.StartupProbe,
			}
			for name, probe := range probes {
				if probe == nil || probe.HTTPGet == nil {
					continue
				}
				if port := probe.HTTPGet.Port; port.Type == intstr.String && !ports[port.StrVal] {
					errs = append(errs, field.NotFound(p.Child(name, "httpGet", "port"), port.StrVal))
				}
			}
		}
	}
	containers("initContainers", spec.InitContainers)
	containers("containers", spec.Containers)
	if len(spec.Containers) == 0 {
		errs = append(errs, field.Required(path.Child("containers"), ""))
	}
	return errs
}

func dnsLabel(path *field.Path, value string) field.ErrorList {
	var errs field.ErrorList
	for _, msg := range validation.IsDNS1123Label(value) {
		errs = append(errs, field.Invalid(path, value, msg))
	}
	return errs
}
