package v1alpha1

import (
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
)

// Group and Version of the API.
const (
	Group   = "kvmesh.io"
	Version = "v1alpha1"
)

// SchemeGroupVersion is kvmesh.io/v1alpha1.
var SchemeGroupVersion = schema.GroupVersion{Group: Group, Version: Version}

// Resources served by the CRDs.
var (
	ModelDeploymentsResource    = SchemeGroupVersion.WithResource("modeldeployments")
	RoleScalersResource         = SchemeGroupVersion.WithResource("rolescalers")
	AutoscalingPoliciesResource = SchemeGroupVersion.WithResource("autoscalingpolicies")
	ModelRoutesResource         = SchemeGroupVersion.WithResource("modelroutes")
	ModelDeploymentKind         = SchemeGroupVersion.WithKind("ModelDeployment")
	RoleScalerKind              = SchemeGroupVersion.WithKind("RoleScaler")
	AutoscalingPolicyKind       = SchemeGroupVersion.WithKind("AutoscalingPolicy")
	ModelRouteKind              = SchemeGroupVersion.WithKind("ModelRoute")
	schemeBuilder               = runtime.NewSchemeBuilder(addKnownTypes)
	AddToScheme                 = schemeBuilder.AddToScheme
)

func addKnownTypes(s *runtime.Scheme) error {
	s.AddKnownTypes(SchemeGroupVersion,
		&ModelDeployment{}, &ModelDeploymentList{},
		&RoleScaler{}, &RoleScalerList{},
		&AutoscalingPolicy{}, &AutoscalingPolicyList{},
		&ModelRoute{}, &ModelRouteList{})
	metav1.AddToGroupVersion(s, SchemeGroupVersion)
	return nil
}
