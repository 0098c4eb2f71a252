# Developer targets of pyw8a8.
#
#   make dist       the sdist and the manylinux wheel in dist/, built from the files git tracks
#                   (uncommitted changes included) in a temporary directory: python -m build
#                   (the wheel from the sdist), then auditwheel repair, which vendors libgomp
#                   under a hashed name; prints the wheel's manylinux tag and the glibc
#                   symbols that set it (.ci/dist.py; needs a C compiler and a package index)
#   make arm-tools  install what the Arm kernel tests need (gcc-aarch64-linux-gnu, qemu-user)
#   make sanitize   build the extension with AddressSanitizer + UndefinedBehaviorSanitizer
#                   (setup.py's PYW8A8_SANITIZE=1) in a scratch copy of the work tree, so the
#                   normal build is left alone, and run the kernel tests against that build
#                   with the sanitizer runtimes preloaded.  Any ASan or UBSan report fails.
#
# Variables: PYTHON, SANITIZE_TESTS (test files, relative to the tree),
#            SANITIZE_PYTEST_ARGS, KEEP_SANITIZE_DIR=1 (keep the scratch copy).

PYTHON ?= python
CC ?= gcc
SANITIZE_TESTS ?= tests/api/test_properties.py tests/api/test_hostile.py \
	tests/processes/test_threads_memory.py tests/kernels/test_int8_matmul.py \
	tests/api/test_matmul.py tests/api/test_quantize.py tests/kernels/test_rotation.py \
	tests/layer/test_fused_layer.py
SANITIZE_PYTEST_ARGS ?= -q -m "not slow" -p no:cacheprovider --capture=sys

.PHONY: sanitize arm-tools dist

dist:
	$(PYTHON) .ci/dist.py

# The cross compiler and qemu that the Arm kernel tests need (tests/c/run.sh arm; Debian).
arm-tools:
	apt-get update -qq
	DEBIAN_FRONTEND=noninteractive apt-get install -y -qq gcc-aarch64-linux-gnu qemu-user
sanitize:
	@set -e; \
	dir=$$(mktemp -d "$${TMPDIR:-/tmp}/pyw8a8-sanitize.XXXXXX"); \
	if [ "$(KEEP_SANITIZE_DIR)" != 1 ]; then trap 'rm -rf "$$dir"' EXIT; fi; \
	echo "sanitize: building in $$dir"; \
	cp -r setup.py pyproject.toml pyw8a8 tests "$$dir"/; \
	rm -rf "$$dir"/pyw8a8/*.so "$$dir"/build; \
	for pyx in "$$dir"/pyw8a8/*.pyx; do rm -f "$${pyx%.pyx}.c"; done; \
	cd "$$dir"; \
	PYW8A8_SANITIZE=1 $(PYTHON) setup.py -q build_ext --inplace > build.log 2>&1 \
		|| { cat build.log; exit 1; }; \
	export LD_PRELOAD="$$($(CC) -print-file-name=libasan.so) $$($(CC) -print-file-name=libubsan.so)"; \
	export ASAN_OPTIONS=detect_leaks=0:abort_on_error=0:halt_on_error=1; \
	export UBSAN_OPTIONS=halt_on_error=1:print_stacktrace=1; \
	export PYW8A8_HYPOTHESIS=sanitize PYTHONPATH="$$dir" ; \
	$(PYTHON) -c "import pyw8a8, sys; f = pyw8a8._kernels.__file__; \
		assert f.startswith('$$dir'), f; print('sanitize: testing', f)"; \
	$(PYTHON) -m pytest $(SANITIZE_PYTEST_ARGS) $(SANITIZE_TESTS)
