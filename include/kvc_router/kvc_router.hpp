// kvc_router/kvc_router.hpp
//
// Umbrella header: everything a gateway needs to route with the KVC-Router
// or with the recommended `ear` policy and the rest of the policy family.
//
//   types.hpp           ids, Request, decision modes, rejection reasons
//   config.hpp          RouterConfig and AdmissionConfig with validation
//   block_hash.hpp      chained XXH3 block hashes, per-session incremental hasher
//   concepts.hpp        CacheIndex and WorkerTransport extension points
//   routing_state.hpp   RoutingState: the router's thread-safe state Σ
//   route.hpp           Algorithm 1, Route
//   admit.hpp           Algorithm 2, AdmissionController (decode-worker side)
//   dispatch.hpp        Algorithm 3, DispatchOp (I/O-free) and Dispatch (blocking)
//   health.hpp          per-worker circuit breakers (worker health)
//   index/              cache indexes: naive reference, placement estimate,
//                       fast estimate (one table, bisection overlap), KV events
//   policy/             the policy interface, KVC as a policy, the EAR family
//                       (ear is the recommended policy) and the LoadLedger a
//                       gateway runs them on
//
// The testing kit (kvc_router/testing/) is not included here; include it from
// tests.
#pragma once

#include "kvc_router/admit.hpp"
#include "kvc_router/block_hash.hpp"
#include "kvc_router/concepts.hpp"
#include "kvc_router/config.hpp"
#include "kvc_router/dispatch.hpp"
#include "kvc_router/health.hpp"
#include "kvc_router/index/estimate_index.hpp"
#include "kvc_router/index/fast_index.hpp"
#include "kvc_router/index/kv_event_index.hpp"
#include "kvc_router/index/naive_index.hpp"
#include "kvc_router/policy/affinity_policies.hpp"
#include "kvc_router/policy/arrival_windows.hpp"
#include "kvc_router/policy/kvc_policy.hpp"
#include "kvc_router/policy/load_ledger.hpp"
#include "kvc_router/policy/policy.hpp"
#include "kvc_router/policy/rendezvous.hpp"
#include "kvc_router/route.hpp"
#include "kvc_router/routing_state.hpp"
#include "kvc_router/types.hpp"
#include "kvc_router/version.hpp"
