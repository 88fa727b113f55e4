//! Test harness: the local control plane, CRDs, throwaway namespaces, waiting.
