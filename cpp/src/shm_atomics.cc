// Atomic operations on 64-bit words of a caller's buffer (a shared-memory block mapped by several
// processes). Python has no cross-process atomics: the ring buffer's slot states and the weight
// board's version words go through these. The GCC/Clang __atomic builtins act on plain memory, so
// the same word is atomic in every process that maps it (lock-free for aligned 64-bit words).
#include <pybind11/pybind11.h>

#include <cstdint>
#include <string>

#include "omnilab/bindings.h"

namespace py = pybind11;

namespace {

static_assert(__atomic_always_lock_free(sizeof(std::uint64_t), nullptr),
              "shared-memory atomics need lock-free 64-bit words");

// The word at `index` of a writable, C-contiguous buffer of 8-byte items, 8-byte aligned.
std::uint64_t* Word(const py::buffer& buffer, py::ssize_t index) {
  py::buffer_info info = buffer.request(/*writable=*/true);
  if (info.itemsize != 8) {
    throw py::value_error("words: expected a buffer of 8-byte items, got itemsize " +
                          std::to_string(info.itemsize));
  }
  if (info.ndim != 1 || (info.strides.size() == 1 && info.strides[0] != 8)) {
    throw py::value_error("words: expected a 1-D contiguous buffer");
  }
  if (index < 0 || index >= info.size) {
    throw py::index_error("index: expected 0 <= index < " + std::to_string(info.size) + ", got " +
                          std::to_string(index));
  }
  auto address = reinterpret_cast<std::uintptr_t>(info.ptr);
  if (address % 8 != 0) throw py::value_error("words: the buffer is not 8-byte aligned");
  return static_cast<std::uint64_t*>(info.ptr) + index;
}

}  // namespace

namespace omnilab {

void BindSharedAtomics(py::module_& mod) {
  mod.def(
      "atomic_load", [](const py::buffer& words, py::ssize_t index) {
        return __atomic_load_n(Word(words, index), __ATOMIC_ACQUIRE);
      },
      py::arg("words"), py::arg("index"), "Acquire-load of words[index].");
  mod.def(
      "atomic_store",
      [](const py::buffer& words, py::ssize_t index, std::uint64_t value) {
        __atomic_store_n(Word(words, index), value, __ATOMIC_RELEASE);
      },
      py::arg("words"), py::arg("index"), py::arg("value"), "Release-store of words[index].");
  mod.def(
      "atomic_compare_exchange",
      [](const py::buffer& words, py::ssize_t index, std::uint64_t expected,
         std::uint64_t desired) {
        return __atomic_compare_exchange_n(Word(words, index), &expected, desired, false,
                                           __ATOMIC_ACQ_REL, __ATOMIC_ACQUIRE);
      },
      py::arg("words"), py::arg("index"), py::arg("expected"), py::arg("desired"),
      "Set words[index] to desired if it equals expected; True when it did (acq_rel).");
  mod.def(
      "atomic_fetch_add",
      [](const py::buffer& words, py::ssize_t index, std::uint64_t delta) {
        return __atomic_fetch_add(Word(words, index), delta, __ATOMIC_ACQ_REL);
      },
      py::arg("words"), py::arg("index"), py::arg("delta"),
      "Add delta to words[index]; returns the value before (acq_rel).");
}

}  // namespace omnilab
