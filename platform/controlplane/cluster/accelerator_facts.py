"""Public facts about the accelerator types that Fleetyard seeds into its database.

Each entry in ``ACCELERATOR_FACTS`` holds one accelerator type's published figures:
dense BF16/FP8 tensor throughput, memory size and bandwidth, interconnect, and one public
on-demand price per device. ``sources`` cites each figure and ``notes`` explains anything uncertain.
This module is plain Python with no Django imports, so migrations, seed commands and tests can all
import it.

Conventions:
- "Dense" means without 2:4 structured sparsity. NVIDIA and AMD datasheets often quote sparse figures
  (NVIDIA marks them with an asterisk). Where only the sparse figure is printed, it is halved here, and
  the notes say so.
- ``memory_bandwidth_gbps`` is in GB/s (gigabytes per second), not gigabits.
- ``price_per_hour_usd`` is the price for one device, not for a whole node, from the public price page
  of the named provider. Prices change often, and providers differ by 2-4x for the same chip, so
  treat them as reference points, not quotes. The public price pages were not reachable live when this
  file was written (2026-11-22). Each price was taken from dated copies of the provider's page; the
  date of the copy is given in the source.
- ``None`` means we found no figure we could trust from the vendor or a reputable source. We never
  fill in an estimate.
"""

import copy

_WRITTEN = "2026-11-22"
_AMD_MI300X = "https://www.amd.com/en/products/accelerators/instinct/mi300/mi300x.html"

ACCELERATOR_FACTS: list[dict] = [
    {
        "slug": "nvidia-h100",
        "vendor": "NVIDIA",
        "model": "H100 SXM5 80GB",
        "bf16_dense_tflops": 989.5,
        "fp8_dense_tflops": 1979.0,
        "memory_gb": 80.0,
        "memory_bandwidth_gbps": 3350.0,
        "interconnect": "NVLink 4, 900 GB/s per GPU (18 links, bidirectional); PCIe Gen5 x16 128 GB/s",
        "price_per_hour_usd": 3.99,
        "sources": {
            "bf16_dense_tflops": "NVIDIA H100 Tensor Core GPU Datasheet, H100 SXM column: BF16 1,979 TFLOPS* "
                                 "(*with sparsity), halved; https://www.nvidia.com/en-us/data-center/h100/",
            "fp8_dense_tflops": "NVIDIA H100 Tensor Core GPU Datasheet, H100 SXM: FP8 3,958 TFLOPS* "
                                "(sparse), halved; https://www.nvidia.com/en-us/data-center/h100/",
            "memory_gb": "NVIDIA H100 Tensor Core GPU Datasheet, H100 SXM: 80GB HBM3; "
                         "https://www.nvidia.com/en-us/data-center/h100/",
            "memory_bandwidth_gbps": "NVIDIA H100 Tensor Core GPU Datasheet, H100 SXM: 3.35 TB/s; "
                                     "https://www.nvidia.com/en-us/data-center/h100/",
            "interconnect": "NVIDIA H100 Tensor Core GPU Datasheet, H100 SXM: NVLink 900GB/s, PCIe Gen5 "
                            "128GB/s; https://www.nvidia.com/en-us/data-center/h100/",
            "price_per_hour_usd": "Lambda public price page, '8x NVIDIA H100 SXM' $3.99 per GPU per hour "
                                  "on-demand; https://lambda.ai/instances (page copies dated 2026-09-20 and "
                                  "2026-09-25 agree; read " + _WRITTEN + ")",
        },
        "notes": "TFLOPS are the datasheet's sparse figures divided by two. NVIDIA's Hopper whitepaper gives "
                 "989.4 dense BF16, which matches. These are tensor-core peaks at boost clock; sustained "
                 "throughput is lower. The price is per GPU in Lambda's 8-GPU instance; a 1-GPU instance was "
                 "$4.29/h on the same page. Other providers' H100 SXM on-demand rates in the same period "
                 "ranged from about $2.7/h to over $6/h per GPU.",
    },
    {
        "slug": "nvidia-h200",
        "vendor": "NVIDIA",
        "model": "H200 SXM 141GB",
        "bf16_dense_tflops": 989.5,
        "fp8_dense_tflops": 1979.0,
        "memory_gb": 141.0,
        "memory_bandwidth_gbps": 4800.0,
        "interconnect": "NVLink 4, 900 GB/s per GPU (18 links, bidirectional); PCIe Gen5 x16 128 GB/s",
        "price_per_hour_usd": 4.59,
        "sources": {
            "bf16_dense_tflops": "NVIDIA H200 Tensor Core GPU datasheet, H200 SXM: BF16 1,979 TFLOPS* "
                                 "(sparse), halved; https://www.nvidia.com/en-us/data-center/h200/",
            "fp8_dense_tflops": "NVIDIA H200 Tensor Core GPU datasheet, H200 SXM: FP8 3,958 TFLOPS* "
                                "(sparse), halved; https://www.nvidia.com/en-us/data-center/h200/",
            "memory_gb": "NVIDIA H200 Tensor Core GPU datasheet: 141GB HBM3e; "
                         "https://www.nvidia.com/en-us/data-center/h200/",
            "memory_bandwidth_gbps": "NVIDIA H200 Tensor Core GPU datasheet: 4.8TB/s; "
                                     "https://www.nvidia.com/en-us/data-center/h200/",
            "interconnect": "NVIDIA H200 Tensor Core GPU datasheet, H200 SXM: NVLink 900GB/s, PCIe Gen5 "
                            "128GB/s; https://www.nvidia.com/en-us/data-center/h200/",
            "price_per_hour_usd": "RunPod public price page, Pods 'H200' $4.59/hr per GPU on-demand; "
                                  "https://www.runpod.io/pricing (page copies dated 2026-09-25 and "
                                  "2026-10-07 agree; read " + _WRITTEN + ")",
        },
        "notes": "The H200 uses the same GH100 compute die as the H100 SXM, so its tensor peaks are the same "
                 "(sparse datasheet figures halved). Only memory size and bandwidth differ. Lambda's "
                 "on-demand list had no H200, so the price comes from RunPod, a different provider from the "
                 "H100 and A100 prices; compare across rows with care. RunPod raised its H100 SXM price in "
                 "mid-October 2026, and we have no copy of its H200 price after 2026-10-07. Hyperstack "
                 "listed H200 SXM at $3.99/h on 2026-08-26.",
    },
    {
        "slug": "nvidia-a100",
        "vendor": "NVIDIA",
        "model": "A100 SXM4 80GB",
        "bf16_dense_tflops": 312.0,
        "fp8_dense_tflops": None,
        "memory_gb": 80.0,
        "memory_bandwidth_gbps": 2039.0,
        "interconnect": "NVLink 3, 600 GB/s per GPU (12 links, bidirectional); PCIe Gen4 x16 64 GB/s",
        "price_per_hour_usd": 2.79,
        "sources": {
            "bf16_dense_tflops": "NVIDIA A100 Tensor Core GPU Datasheet: BF16 Tensor Core 312 TFLOPS (624* "
                                 "with sparsity); https://www.nvidia.com/content/dam/en-zz/Solutions/"
                                 "Data-Center/a100/pdf/nvidia-a100-datasheet-us-nvidia-1758950-r4-web.pdf",
            "fp8_dense_tflops": "NVIDIA A100 Tensor Core GPU Datasheet lists no FP8 row (Ampere tensor cores "
                                "have no FP8); same URL as bf16_dense_tflops",
            "memory_gb": "NVIDIA A100 Tensor Core GPU Datasheet, A100 80GB SXM: 80GB HBM2e; "
                         "https://www.nvidia.com/en-us/data-center/a100/",
            "memory_bandwidth_gbps": "NVIDIA A100 Tensor Core GPU Datasheet, A100 80GB SXM: 2,039 GB/s; "
                                     "https://www.nvidia.com/en-us/data-center/a100/",
            "interconnect": "NVIDIA A100 Tensor Core GPU Datasheet, SXM: NVLink 600GB/s, PCIe Gen4 64GB/s; "
                            "https://www.nvidia.com/en-us/data-center/a100/",
            "price_per_hour_usd": "Lambda public price page, '8x NVIDIA A100 SXM 80 GB' $2.79 per GPU per "
                                  "hour on-demand; https://lambda.ai/instances (page copies dated 2026-09-20 "
                                  "and 2026-09-25 agree; read " + _WRITTEN + ")",
        },
        "notes": "The A100 datasheet prints the dense BF16 figure directly (312), with 624 for sparse, so no "
                 "halving is needed. FP8 is left empty because Ampere has no FP8 tensor support. The figures are "
                 "for the 80GB SXM4 part; the 40GB part has 1,555 GB/s, and the PCIe parts have lower "
                 "bandwidth and no NVSwitch. Lambda's A100 price is high compared with other providers: "
                 "RunPod listed A100 SXM 80GB at $1.39-$1.79/h per GPU in Sep-Nov 2026.",
    },
    {
        "slug": "nvidia-l40s",
        "vendor": "NVIDIA",
        "model": "L40S 48GB PCIe",
        "bf16_dense_tflops": 362.05,
        "fp8_dense_tflops": 733.0,
        "memory_gb": 48.0,
        "memory_bandwidth_gbps": 864.0,
        "interconnect": "PCIe Gen4 x16, 64 GB/s bidirectional; no NVLink",
        "price_per_hour_usd": 1.09,
        "sources": {
            "bf16_dense_tflops": "NVIDIA L40S Datasheet: BFLOAT16 Tensor Core 362.05 | 733* TFLOPS (*with "
                                 "sparsity); https://www.nvidia.com/en-us/data-center/l40s/",
            "fp8_dense_tflops": "NVIDIA L40S Datasheet: FP8 Tensor Core 733 | 1,466* TFLOPS (*with "
                                "sparsity); https://www.nvidia.com/en-us/data-center/l40s/",
            "memory_gb": "NVIDIA L40S Datasheet: 48GB GDDR6 with ECC; "
                         "https://www.nvidia.com/en-us/data-center/l40s/",
            "memory_bandwidth_gbps": "NVIDIA L40S Datasheet: 864GB/s; "
                                     "https://www.nvidia.com/en-us/data-center/l40s/",
            "interconnect": "NVIDIA L40S Datasheet: PCIe Gen4 x16 64GB/s bidirectional; NVLink not "
                            "supported; https://www.nvidia.com/en-us/data-center/l40s/",
            "price_per_hour_usd": "RunPod public price page, 'L40S' Secure Cloud $1.09/hr per GPU on-demand; "
                                  "https://www.runpod.io/pricing (page copy dated 2026-09-25; read "
                                  + _WRITTEN + ")",
        },
        "notes": "The L40S datasheet prints both figures: dense first, then sparse with an asterisk. The "
                 "dense values are used, so no halving is needed. It is an Ada Lovelace PCIe card with GDDR6 "
                 "and no NVLink, so multi-GPU jobs go over PCIe. The price comes from a single dated copy of "
                 "RunPod's page (Secure Cloud; Community Cloud was $0.79/h). Nebius listed L40S at $1.55/h "
                 "on the same date.",
    },
    {
        "slug": "amd-mi300x",
        "vendor": "AMD",
        "model": "Instinct MI300X 192GB OAM",
        "bf16_dense_tflops": 1307.4,
        "fp8_dense_tflops": 2614.9,
        "memory_gb": 192.0,
        "memory_bandwidth_gbps": 5300.0,
        "interconnect": "AMD Infinity Fabric (xGMI), 7 links x 128 GB/s = 896 GB/s peer bandwidth per GPU; "
                        "PCIe Gen5 x16 128 GB/s",
        "price_per_hour_usd": 2.59,
        "sources": {
            "bf16_dense_tflops": "AMD Instinct MI300X Accelerator data sheet: peak BF16 1307.4 TFLOPS "
                                 "(2614.9 with structured sparsity); " + _AMD_MI300X,
            "fp8_dense_tflops": "AMD Instinct MI300X Accelerator data sheet: peak FP8 2614.9 TFLOPS (5229.8 "
                                "with structured sparsity); " + _AMD_MI300X,
            "memory_gb": "AMD Instinct MI300X Accelerator data sheet: 192 GB HBM3; " + _AMD_MI300X,
            "memory_bandwidth_gbps": "AMD Instinct MI300X Accelerator data sheet: 5.3 TB/s peak; "
                                     + _AMD_MI300X,
            "interconnect": "AMD Instinct MI300X Accelerator data sheet: 7 Infinity Fabric links, 128 GB/s "
                            "each, 896 GB/s aggregate; PCIe Gen5 x16; " + _AMD_MI300X,
            "price_per_hour_usd": "DigitalOcean AMD GPU Droplet pricing: gpu-mi300x1-192gb $2.59/h (8-GPU "
                                  "gpu-mi300x8-1536gb $20.72/h = $2.59/GPU); "
                                  "https://docs.digitalocean.com/products/amd/details/pricing/ (list-price "
                                  "copies dated 2026-10-01 to 2026-10-08; read " + _WRITTEN + ")",
        },
        "notes": "AMD's data sheet prints dense and sparse figures separately. The dense ones are used, so "
                 "no halving is needed. Some secondary sites wrongly quote 2,615 TFLOPS as dense FP16. The "
                 "896 GB/s is the sum over 7 links to the other GPUs on an 8-GPU OAM board; no single pair "
                 "of GPUs gets that much. The price is DigitalOcean's published list price. A copy dated "
                 "2026-10-01 noted that the 1-GPU size was listed but offered in no region, so the list "
                 "price may not be rentable everywhere.",
    },
    {
        "slug": "kunlun-p800",
        "vendor": "Kunlunxin (Baidu)",
        "model": "Kunlun P800",
        "bf16_dense_tflops": None,
        "fp8_dense_tflops": None,
        "memory_gb": None,
        "memory_bandwidth_gbps": None,
        "interconnect": "Not published (proprietary Kunlunxin chip-to-chip link; no official figures)",
        "price_per_hour_usd": None,
        "sources": {
            "bf16_dense_tflops": "No official datasheet found in English or Chinese",
            "fp8_dense_tflops": "No official datasheet found in English or Chinese",
            "memory_gb": "No official datasheet found; secondary reports disagree on the memory type",
            "memory_bandwidth_gbps": "No official datasheet found in English or Chinese",
            "interconnect": "Baidu announcements (Baidu Create 2025: 30,000-chip P800 cluster; Baidu World, "
                            "2025-11-13: Tianchi super-node roadmap) give cluster sizes but no per-chip link "
                            "bandwidth",
            "price_per_hour_usd": "No public per-device on-demand price found (P800 capacity is sold through "
                                  "Baidu AI Cloud; no price page found)",
        },
        "notes": "Poorly documented in public. Baidu's Kunlunxin unit brought out the P800, its "
                 "third-generation XPU, in 2024-2025, and Baidu says it runs a 30,000-chip P800 cluster. No "
                 "official datasheet with TFLOPS, memory or bandwidth could be found. One analyst "
                 "(hellochinatech.com, 2025) says the P800 uses GDDR6 rather than HBM and that its specs "
                 "come only from conference talks and securities research. We did not verify that, so memory "
                 "is left empty. Every figure is empty on purpose; fill them in only from a Kunlunxin or Baidu "
                 "publication.",
    },
    {
        "slug": "ascend-910b",
        "vendor": "Huawei",
        "model": "Ascend 910B",
        "bf16_dense_tflops": None,
        "fp8_dense_tflops": None,
        "memory_gb": None,
        "memory_bandwidth_gbps": None,
        "interconnect": "HCCS (Huawei Cache Coherence System) chip-to-chip + PCIe; per-chip bandwidth not "
                        "published in an official datasheet",
        "price_per_hour_usd": None,
        "sources": {
            "bf16_dense_tflops": "No official Huawei datasheet for the 910B found; the original Ascend 910 "
                                 "(2019) was published at 256 TFLOPS FP16, which does not apply to the 910B",
            "fp8_dense_tflops": "The Ascend 910B has no FP8 support; Huawei introduced FP8 with the Ascend "
                                "950 series (Huawei Connect, 2025-09-18)",
            "memory_gb": "No official Huawei datasheet found; secondary sources report 32 GB or 64 GB HBM2e",
            "memory_bandwidth_gbps": "No official Huawei datasheet found; secondary sources disagree (0.4 to "
                                     "1.6 TB/s)",
            "interconnect": "Huawei MindCluster documentation describes HCCS links between Ascend "
                            "processors; https://www.hiascend.com/document/detail/en/mindcluster/730/"
                            "clustersched/schedulingug/dl_affinity_0040.html",
            "price_per_hour_usd": "No public per-device on-demand price in USD found (Ascend capacity is "
                                  "sold through Huawei Cloud ModelArts)",
        },
        "notes": "Poorly documented in English, and Huawei publishes no 910B datasheet. Secondary reports "
                 "(blogs and Chinese media) put FP16 at about 320 TFLOPS and memory at 64 GB HBM2e, but they "
                 "disagree on bandwidth (400 GB/s to 1.6 TB/s) and one says 32 GB. Because of that, every "
                 "numeric figure is left empty. FP8 is empty because the 910B has no FP8 data type. The 910C "
                 "is two 910B dies in one package; do not confuse the two.",
    },
    {
        "slug": "cpu",
        "vendor": "Generic (x86-64 cloud vCPU)",
        "model": "General-purpose cloud vCPU (AWS EC2 m7i, 4th Gen Intel Xeon Scalable), priced per vCPU",
        "bf16_dense_tflops": None,
        "fp8_dense_tflops": None,
        "memory_gb": None,
        "memory_bandwidth_gbps": None,
        "interconnect": "Not applicable (host Ethernet networking; no accelerator interconnect)",
        "price_per_hour_usd": 0.0504,
        "sources": {
            "bf16_dense_tflops": "Not applicable: a vCPU has no tensor-core peak comparable to a GPU's",
            "fp8_dense_tflops": "Not applicable: no FP8 matrix unit",
            "memory_gb": "Not applicable per device; m7i.large ships 8 GiB per 2 vCPUs (4 GiB per vCPU); "
                         "https://aws.amazon.com/ec2/instance-types/m7i/",
            "memory_bandwidth_gbps": "Not applicable per vCPU (bandwidth is shared by the whole socket)",
            "interconnect": "Not applicable",
            "price_per_hour_usd": "AWS EC2 On-Demand Pricing, Linux, us-east-1: m7i.large (2 vCPU, 8 GiB) "
                                  "$0.1008/h, divided by 2 vCPUs; "
                                  "https://aws.amazon.com/ec2/pricing/on-demand/ (two independent 2026 "
                                  "copies agree; read " + _WRITTEN + ")",
        },
        "notes": "The 'cpu' type is billed per vCPU, not per device. The price is AWS m7i.large's on-demand "
                 "Linux price in us-east-1 ($0.1008/h for 2 vCPUs) divided by 2, and it includes that "
                 "instance's share of memory (4 GiB per vCPU). An AWS x86 vCPU is one hyperthread, i.e. half "
                 "a physical core. TFLOPS, memory and bandwidth are left empty because they describe a whole "
                 "socket, not a vCPU.",
    },
]


def facts_by_slug() -> dict[str, dict]:
    """Return the facts keyed by slug. Each value is a deep copy, so callers cannot change the module data."""
    return {fact["slug"]: copy.deepcopy(fact) for fact in ACCELERATOR_FACTS}
