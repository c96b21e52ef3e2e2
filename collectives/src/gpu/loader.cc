#include "trainrun/collectives/gpu/loader.h"

#include <dlfcn.h>
#include <glob.h>
#include <sys/stat.h>
#include <unistd.h>

#include <climits>
#include <cstdlib>
#include <mutex>
#include <optional>
#include <sstream>

#include "trainrun/collectives/errors.h"
#include "trainrun/rendezvous/environment.h"

namespace trainrun::collectives::gpu {
namespace {

std::mutex& SiteMutex() {
  static std::mutex mutex;
  return mutex;
}

std::vector<std::string>& SiteFolders() {
  static std::vector<std::string> folders;
  return folders;
}

bool IsDirectory(const std::string& path) {
  struct stat st {};
  return ::stat(path.c_str(), &st) == 0 && S_ISDIR(st.st_mode);
}

void AddUnique(std::vector<std::string>& list, const std::string& item) {
  for (const std::string& known : list) {
    if (known == item) return;
  }
  list.push_back(item);
}

// PythonSiteFolders: the site-packages and dist-packages folders of every python3 on PATH (the
// venv's own and, through the link, its base interpreter's).
std::vector<std::string> PythonSiteFolders() {
  std::vector<std::string> out;
  const std::optional<std::string> path = env::Lookup(env::kPath);
  if (!path) return out;
  std::stringstream dirs(*path);
  std::string dir;
  while (std::getline(dirs, dir, ':')) {
    if (dir.empty()) continue;
    const std::string python = dir + "/python3";
    if (::access(python.c_str(), X_OK) != 0) continue;
    std::vector<std::string> prefixes = {dir + "/.."};
    char resolved[PATH_MAX];
    if (::realpath(python.c_str(), resolved) != nullptr) {
      std::string real(resolved);
      prefixes.push_back(real.substr(0, real.rfind('/')) + "/..");
    }
    for (const std::string& prefix : prefixes) {
      for (const char* pattern : {"/lib/python3*/site-packages", "/lib/python3*/dist-packages",
                                  "/local/lib/python3*/dist-packages"}) {
        glob_t found{};
        if (::glob((prefix + pattern).c_str(), 0, nullptr, &found) == 0) {
          for (size_t i = 0; i < found.gl_pathc; ++i) AddUnique(out, found.gl_pathv[i]);
        }
        ::globfree(&found);
      }
    }
  }
  return out;
}

std::string DlError() {
  const char* error = ::dlerror();
  return error ? error : "unknown error";
}

// Open searches `names` as the header describes. `override_var` may be null (no override);
// `wheel_dirs` are folders relative to a site folder; `extra_dirs` absolute folders tried after
// the wheels.
LibraryLoad Open(const char* what, const std::vector<std::string>& names, const char* override_var,
                 const std::vector<std::string>& wheel_dirs,
                 const std::vector<std::string>& extra_dirs) {
  LibraryLoad load;
  auto try_path = [&](const std::string& path) {
    ::dlerror();
    void* handle = ::dlopen(path.c_str(), RTLD_NOW | RTLD_GLOBAL);
    if (handle == nullptr) return std::string(DlError());
    load.handle = handle;
    load.path = path;
    return std::string();
  };
  if (override_var != nullptr) {
    if (std::optional<std::string> value = env::Lookup(override_var); value && !value->empty()) {
      std::string error;
      if (IsDirectory(*value)) {
        for (const std::string& name : names) {
          error = try_path(*value + "/" + name);
          if (load.handle) return load;
        }
      } else {
        error = try_path(*value);
        if (load.handle) return load;
      }
      load.why_not = internal::MakeMessage(what, " did not load from ", override_var, "=", *value,
                                           ": ", error);
      return load;
    }
  }
  for (const std::string& name : names) {  // a copy already in the process (PyTorch's)
    void* handle = ::dlopen(name.c_str(), RTLD_NOW | RTLD_NOLOAD);
    if (handle != nullptr) {
      load.handle = handle;
      Dl_info info{};
      void* symbol = ::dlsym(handle, "ncclGetVersion");
      if (symbol == nullptr) symbol = ::dlsym(handle, "cudaGetDeviceCount");
      if (symbol == nullptr) symbol = ::dlsym(handle, "cuInit");
      load.path = (symbol && ::dladdr(symbol, &info) && info.dli_fname) ? info.dli_fname : name;
      return load;
    }
  }
  std::vector<std::string> folders;
  {
    std::lock_guard<std::mutex> lock(SiteMutex());
    folders = SiteFolders();
  }
  for (const std::string& folder : PythonSiteFolders()) AddUnique(folders, folder);
  int wheel_folders = 0;
  std::string wheel_error;
  for (const std::string& site : folders) {
    for (const std::string& sub : wheel_dirs) {
      const std::string dir = site + "/" + sub;
      if (!IsDirectory(dir)) continue;
      ++wheel_folders;
      for (const std::string& name : names) {
        if (::access((dir + "/" + name).c_str(), F_OK) != 0) continue;
        wheel_error = try_path(dir + "/" + name);
        if (load.handle) return load;
      }
    }
  }
  for (const std::string& dir : extra_dirs) {
    for (const std::string& name : names) {
      if (::access((dir + "/" + name).c_str(), F_OK) != 0) continue;
      try_path(dir + "/" + name);
      if (load.handle) return load;
    }
  }
  std::string loader_error;
  for (const std::string& name : names) {
    loader_error = try_path(name);
    if (load.handle) return load;
  }
  std::ostringstream why;
  why << what << " was not found: ";
  if (override_var != nullptr) why << override_var << " is unset; ";
  if (!wheel_dirs.empty()) {
    why << (wheel_folders == 0 ? "no Python wheel folder " : "the Python wheel folders ");
    for (size_t i = 0; i < wheel_dirs.size(); ++i) why << (i ? " or " : "") << wheel_dirs[i];
    why << (wheel_folders == 0 ? internal::MakeMessage(" under ", folders.size(), " site folders")
                               : " did not hold a loadable copy" +
                                     (wheel_error.empty() ? "" : " (" + wheel_error + ")"));
    why << "; ";
  }
  why << "the loader's path: " << loader_error;
  load.why_not = why.str();
  return load;
}

}  // namespace

void AddSiteFolders(const std::vector<std::string>& folders) {
  std::lock_guard<std::mutex> lock(SiteMutex());
  for (const std::string& folder : folders) {
    if (!folder.empty()) AddUnique(SiteFolders(), folder);
  }
}

const LibraryLoad& OpenNccl() {
  static const LibraryLoad load = Open("NCCL (libnccl.so.2)", {"libnccl.so.2"}, env::kNcclLibrary,
                                       {"nvidia/nccl/lib", "nvidia/cu13/lib"},
                                       {"/usr/local/cuda/lib64", "/usr/local/cuda/lib"});
  return load;
}

const LibraryLoad& OpenCudaRuntime() {
  static const LibraryLoad load =
      Open("CUDA's runtime (libcudart.so.13 or .12)",
           {"libcudart.so.13", "libcudart.so.12", "libcudart.so"}, env::kCudaLibrary,
           {"nvidia/cu13/lib", "nvidia/cuda_runtime/lib"},
           {"/usr/local/cuda/lib64", "/usr/local/cuda/lib"});
  return load;
}

const LibraryLoad& OpenCudaDriver() {
  static const LibraryLoad load =
      Open("the NVIDIA driver (libcuda.so.1)", {"libcuda.so.1"}, nullptr, {}, {});
  return load;
}

GpuProbe ProbeHost() {
  GpuProbe probe;
  const LibraryLoad& driver = OpenCudaDriver();
  if (driver.handle == nullptr) {
    probe.driver_why_not = driver.why_not;
  } else {
    using InitFn = int (*)(unsigned);
    using IntFn = int (*)(int*);
    auto init = reinterpret_cast<InitFn>(::dlsym(driver.handle, "cuInit"));
    auto count = reinterpret_cast<IntFn>(::dlsym(driver.handle, "cuDeviceGetCount"));
    auto version = reinterpret_cast<IntFn>(::dlsym(driver.handle, "cuDriverGetVersion"));
    if (!init || !count || !version) {
      probe.driver_why_not = driver.path + " lacks cuInit, cuDeviceGetCount or cuDriverGetVersion";
    } else {
      version(&probe.driver_version);
      const int status = init(0);
      if (status != 0) {
        probe.driver_why_not = internal::MakeMessage("cuInit failed with CUDA error ", status,
                                                     " (no usable GPU, or a driver mismatch)");
      } else if (count(&probe.gpu_count) != 0) {
        probe.gpu_count = 0;
      }
    }
  }
  const LibraryLoad& nccl = OpenNccl();
  if (nccl.handle == nullptr) {
    probe.nccl_why_not = nccl.why_not;
  } else {
    probe.nccl_path = nccl.path;
    using VersionFn = int (*)(int*);
    auto version = reinterpret_cast<VersionFn>(::dlsym(nccl.handle, "ncclGetVersion"));
    if (version == nullptr || version(&probe.nccl_version) != 0) {
      probe.nccl_why_not = nccl.path + " does not answer ncclGetVersion";
      probe.nccl_version = 0;
    }
  }
  return probe;
}

std::string VersionString(int version, bool nccl) {
  if (nccl) {
    // NCCL >= 2.9: major * 10000 + minor * 100 + patch; before: major * 1000 + minor * 100 + patch.
    const int major = version >= 20900 ? version / 10000 : version / 1000;
    const int minor = version >= 20900 ? (version % 10000) / 100 : (version % 1000) / 100;
    return internal::MakeMessage(major, ".", minor, ".", version % 100);
  }
  return internal::MakeMessage(version / 1000, ".", (version % 1000) / 10);
}

std::string DescribeProbe(const GpuProbe& probe) {
  std::ostringstream out;
  if (!probe.driver_why_not.empty() && probe.driver_version == 0) {
    out << (OpenCudaDriver().handle == nullptr ? "no GPU driver (libcuda.so.1 did not load)"
                                               : "no usable GPU (" + probe.driver_why_not + ")");
  } else {
    out << probe.gpu_count << (probe.gpu_count == 1 ? " GPU" : " GPUs") << ", driver CUDA "
        << VersionString(probe.driver_version, false);
    if (!probe.driver_why_not.empty()) out << " (" << probe.driver_why_not << ")";
  }
  if (probe.nccl_version > 0) {
    out << ", NCCL " << VersionString(probe.nccl_version, true) << " (" << probe.nccl_path << ")";
  } else {
    out << ", no NCCL (" << probe.nccl_why_not << ")";
  }
  return out.str();
}

}  // namespace trainrun::collectives::gpu
