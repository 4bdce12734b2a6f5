"""The conformance kit (``unitrain.conformance``): certifies that a backend trains like the
numpy reference. Its checks are being built; see the project's issue tracker."""
