// FunctionRef: a callable borrowed for the length of one call (C++26's std::function_ref).
//
// std::function owns a copy of its callable, and a callable larger than two pointers (a lambda that
// holds a Tensor, say) is copied to the heap. Where the callee only calls it before returning, a
// reference does: two pointers, no copy, no allocation. The callable must outlive the FunctionRef,
// so take one as a parameter, never keep one.
#pragma once

#include <functional>
#include <memory>
#include <type_traits>
#include <utility>

namespace tinyddp {

template <class Signature>
class FunctionRef;

template <class R, class... Args>
class FunctionRef<R(Args...)> {
 public:
  template <class F, class = std::enable_if_t<!std::is_same_v<std::remove_cvref_t<F>, FunctionRef> &&
                                              std::is_invocable_r_v<R, F&, Args...>>>
  FunctionRef(F&& f) noexcept {  // NOLINT(google-explicit-constructor): it stands in for the callable
    using Callable = std::remove_reference_t<F>;
    // A function is no object, and its address no void*: it is kept as a function pointer.
    if constexpr (std::is_function_v<Callable>) {
      target_.function = reinterpret_cast<void (*)()>(&f);
      call_ = [](Target target, Args... args) -> R {
        return std::invoke(reinterpret_cast<Callable*>(target.function), std::forward<Args>(args)...);
      };
    } else {
      target_.object = const_cast<void*>(static_cast<const void*>(std::addressof(f)));
      call_ = [](Target target, Args... args) -> R {
        return std::invoke(*static_cast<Callable*>(target.object), std::forward<Args>(args)...);
      };
    }
  }

  R operator()(Args... args) const { return call_(target_, std::forward<Args>(args)...); }

 private:
  union Target {
    void* object;
    void (*function)();
  };
  Target target_;
  R (*call_)(Target, Args...);
};

}  // namespace tinyddp
