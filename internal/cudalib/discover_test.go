package cudalib

import (
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"testing"
)

// touch creates path and its directories, empty.
func touch(t *testing.T, path string) {
	t.Helper()
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(path, nil, 0o644); err != nil {
		t.Fatal(err)
	}
}

// systemAndLoader is the fixed middle of every candidate list: the system
// directories under $ROOT, then the bare sonames.
func systemAndLoader(sonames ...string) []string {
	multiarch := map[string]string{"amd64": "/usr/lib/x86_64-linux-gnu", "arm64": "/usr/lib/aarch64-linux-gnu"}[runtime.GOARCH]
	var out []string
	for _, dir := range []string{multiarch, "/usr/local/cuda/lib64", "/usr/lib64", "/usr/lib", "/usr/local/lib"} {
		if dir == "" {
			continue
		}
		for _, so := range sonames {
			out = append(out, "system: $T/root"+dir+"/"+so)
		}
	}
	for _, so := range sonames {
		out = append(out, "dynamic loader: "+so)
	}
	return out
}

// systemPython is the python tail when no system site-packages exists.
func systemPython(sonames ...string) []string {
	var out []string
	for _, p := range []string{"/usr/local/lib/python3*/site-packages", "/usr/local/lib/python3*/dist-packages", "/usr/lib/python3*/dist-packages"} {
		for _, so := range sonames {
			out = append(out, "python site-packages: $T/root"+p+"/nvidia/*/lib/"+so)
		}
	}
	return out
}

func concat(parts ...[]string) []string { return slices.Concat(parts...) }

func TestCandidatesOrder(t *testing.T) {
	const sp = "lib/python3.12/site-packages"
	tests := []struct {
		name string
		lib  Library
		// files are created under $T before Candidates runs.
		files []string
		dirs  []string
		// setting is Options.NCCLPath or RuntimePath, under $T unless absolute.
		setting string
		env     map[string]string
		want    []string
	}{{
		name: "nothing set",
		lib:  LibNCCL,
		want: concat(systemAndLoader("libnccl.so.2"), systemPython("libnccl.so.2")),
	}, {
		name:    "setting dir, env file, LD_LIBRARY_PATH with a system dir and an empty element",
		lib:     LibNCCL,
		dirs:    []string{"set"},
		setting: "set",
		env: map[string]string{
			"COHORT_NCCL_LIBRARY": "$T/env/libnccl.so.2.21.5",
			"LD_LIBRARY_PATH":     "$T/ld/::$T/root/usr/lib64",
		},
		want: concat([]string{
			"setting nccl_library: $T/set/libnccl.so.2",
			"COHORT_NCCL_LIBRARY: $T/env/libnccl.so.2.21.5",
			"LD_LIBRARY_PATH: $T/ld/libnccl.so.2",
			"LD_LIBRARY_PATH: $T/root/usr/lib64/libnccl.so.2",
		}, slices.DeleteFunc(systemAndLoader("libnccl.so.2"), func(s string) bool { return strings.Contains(s, "/usr/lib64/") }),
			systemPython("libnccl.so.2")),
	}, {
		name:    "setting file and env dir; a missing setting path is kept as given",
		lib:     LibNCCL,
		files:   []string{"custom/libnccl-2.21.so"},
		dirs:    []string{"envdir"},
		setting: "custom/libnccl-2.21.so",
		env:     map[string]string{"COHORT_NCCL_LIBRARY": "$T/envdir", "COHORT_CUDART_LIBRARY": "$T/wrong"},
		want: concat([]string{
			"setting nccl_library: $T/custom/libnccl-2.21.so",
			"COHORT_NCCL_LIBRARY: $T/envdir/libnccl.so.2",
		}, systemAndLoader("libnccl.so.2"), systemPython("libnccl.so.2")),
	}, {
		name:    "missing setting path",
		lib:     LibNCCL,
		setting: "/nonexistent/nccl",
		want:    concat([]string{"setting nccl_library: /nonexistent/nccl"}, systemAndLoader("libnccl.so.2"), systemPython("libnccl.so.2")),
	}, {
		name: "python: venv, conda, user, then system; every nvidia package; empty site-packages as a pattern",
		lib:  LibNCCL,
		files: []string{
			"venv/" + sp + "/nvidia/nccl/lib/libnccl.so.2",
			"conda/" + sp + "/nvidia/nccl/lib/libnccl.so.2",
			"conda/" + sp + "/nvidia/cublas/lib/libcublas.so.12",
			"home/.local/" + sp + "/nvidia/nccl/lib/libnccl.so.2",
			"root/usr/local/lib/python3.11/dist-packages/nvidia/nccl/lib/libnccl.so.2",
			"root/usr/local/lib/python3.12/dist-packages/nvidia/nccl/lib/libnccl.so.2",
			"root/usr/local/lib/python3.12/dist-packages/nvidia/other/lib/libnccl.so.2",
		},
		dirs: []string{"root/usr/lib/python3/dist-packages"},
		env:  map[string]string{"VIRTUAL_ENV": "$T/venv", "CONDA_PREFIX": "$T/conda", "HOME": "$T/home"},
		want: concat(systemAndLoader("libnccl.so.2"), []string{
			"python site-packages: $T/venv/" + sp + "/nvidia/nccl/lib/libnccl.so.2",
			"python site-packages: $T/conda/" + sp + "/nvidia/nccl/lib/libnccl.so.2",
			"python site-packages: $T/home/.local/" + sp + "/nvidia/nccl/lib/libnccl.so.2",
			"python site-packages: $T/root/usr/local/lib/python3*/site-packages/nvidia/*/lib/libnccl.so.2",
			"python site-packages: $T/root/usr/local/lib/python3.11/dist-packages/nvidia/nccl/lib/libnccl.so.2",
			"python site-packages: $T/root/usr/local/lib/python3.12/dist-packages/nvidia/nccl/lib/libnccl.so.2",
			"python site-packages: $T/root/usr/local/lib/python3.12/dist-packages/nvidia/other/lib/libnccl.so.2",
			"python site-packages: $T/root/usr/lib/python3/dist-packages/nvidia/*/lib/libnccl.so.2",
		}),
	}, {
		name:    "runtime: newest soname first within each place, the setting before a newer one elsewhere",
		lib:     LibRuntime,
		dirs:    []string{"cuda"},
		setting: "cuda",
		files: []string{
			"venv/" + sp + "/nvidia/cuda_runtime/lib/libcudart.so.12",
			"venv/" + sp + "/nvidia/cu13/lib/libcudart.so.13",
		},
		env: map[string]string{"VIRTUAL_ENV": "$T/venv", "COHORT_NCCL_LIBRARY": "$T/wrong"},
		want: concat([]string{
			"setting cudart_library: $T/cuda/libcudart.so.13",
			"setting cudart_library: $T/cuda/libcudart.so.12",
		}, systemAndLoader("libcudart.so.13", "libcudart.so.12"), []string{
			"python site-packages: $T/venv/" + sp + "/nvidia/cu13/lib/libcudart.so.13",
			"python site-packages: $T/venv/" + sp + "/nvidia/cuda_runtime/lib/libcudart.so.12",
		}, systemPython("libcudart.so.13", "libcudart.so.12")),
	}}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			T := t.TempDir()
			for _, f := range tc.files {
				touch(t, filepath.Join(T, f))
			}
			for _, d := range append(tc.dirs, "root") {
				if err := os.MkdirAll(filepath.Join(T, d), 0o755); err != nil {
					t.Fatal(err)
				}
			}
			o := Options{Root: filepath.Join(T, "root"), Getenv: func(k string) string {
				return strings.ReplaceAll(tc.env[k], "$T", T)
			}}
			setting := tc.setting
			if setting != "" && !filepath.IsAbs(setting) {
				setting = filepath.Join(T, setting)
			}
			if tc.lib == LibNCCL {
				o.NCCLPath, o.RuntimePath = setting, "$T/wrong"
			} else {
				o.NCCLPath, o.RuntimePath = "$T/wrong", setting
			}
			var got []string
			for _, c := range Candidates(tc.lib, o) {
				got = append(got, c.From+": "+strings.ReplaceAll(c.Path, T, "$T"))
			}
			if !slices.Equal(got, tc.want) {
				t.Errorf("candidates:\n\t%s\nwant:\n\t%s", strings.Join(got, "\n\t"), strings.Join(tc.want, "\n\t"))
			}
		})
	}
}

func TestVersionDecoding(t *testing.T) {
	tests := []struct {
		name string
		got  Version
		want string
	}{
		{"nccl before 2.9", ncclVersion(2804), "2.8.4"},
		{"nccl 2.9 and later", ncclVersion(22105), "2.21.5"},
		{"nccl two-digit patch", ncclVersion(21913), "2.19.13"},
		{"cuda 12.4", runtimeVersion(12040), "12.4.0"},
		{"cuda 13.0", runtimeVersion(13000), "13.0.0"},
	}
	for _, tc := range tests {
		if tc.got.String() != tc.want {
			t.Errorf("%s: got %s, want %s", tc.name, tc.got, tc.want)
		}
	}
}
