package v1alpha1

import (
	"encoding/json"

	"k8s.io/apimachinery/pkg/runtime"
)

// deepCopy copies through JSON, which every field of these types supports.
func deepCopy[T any](in *T) *T {
	if in == nil {
		return nil
	}
	b, err := json.Marshal(in)
	if err != nil {
		panic("v1alpha1: deep copy marshal: " + err.Error()) // unreachable: the types are plain data
	}
	out := new(T)
	if err := json.Unmarshal(b, out); err != nil {
		panic("v1alpha1: deep copy unmarshal: " + err.Error())
	}
	return out
}

// DeepCopy returns a deep copy.
func (in *ModelDeployment) DeepCopy() *ModelDeployment { return deepCopy(in) }

// DeepCopyObject implements runtime.Object.
func (in *ModelDeployment) DeepCopyObject() runtime.Object { return in.DeepCopy() }

// DeepCopy returns a deep copy.
func (in *ModelDeploymentList) DeepCopy() *ModelDeploymentList { return deepCopy(in) }

// DeepCopyObject implements runtime.Object.
func (in *ModelDeploymentList) DeepCopyObject() runtime.Object { return in.DeepCopy() }

// DeepCopy returns a deep copy.
func (in *RoleScaler) DeepCopy() *RoleScaler { return deepCopy(in) }

// DeepCopyObject implements runtime.Object.
func (in *RoleScaler) DeepCopyObject() runtime.Object { return in.DeepCopy() }

// DeepCopy returns a deep copy.
func (in *RoleScalerList) DeepCopy() *RoleScalerList { return deepCopy(in) }

// DeepCopyObject implements runtime.Object.
func (in *RoleScalerList) DeepCopyObject() runtime.Object { return in.DeepCopy() }

// DeepCopy returns a deep copy.
func (in *AutoscalingPolicy) DeepCopy() *AutoscalingPolicy { return deepCopy(in) }

// DeepCopyObject implements runtime.Object.
func (in *AutoscalingPolicy) DeepCopyObject() runtime.Object { return in.DeepCopy() }

// DeepCopy returns a deep copy.
func (in *AutoscalingPolicyList) DeepCopy() *AutoscalingPolicyList { return deepCopy(in) }

// DeepCopyObject implements runtime.Object.
func (in *AutoscalingPolicyList) DeepCopyObject() runtime.Object { return in.DeepCopy() }

// DeepCopy returns a deep copy.
func (in *ModelRoute) DeepCopy() *ModelRoute { return deepCopy(in) }

// DeepCopyObject implements runtime.Object.
func (in *ModelRoute) DeepCopyObject() runtime.Object { return in.DeepCopy() }

// DeepCopy returns a deep copy.
func (in *ModelRouteList) DeepCopy() *ModelRouteList { return deepCopy(in) }

// DeepCopyObject implements runtime.Object.
func (in *ModelRouteList) DeepCopyObject() runtime.Object { return in.DeepCopy() }
