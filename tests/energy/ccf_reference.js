// Reference numbers from the packages' own code, for test_vs_ccf.py: Cloud Carbon
// Footprint's ComputeEstimator and MemoryEstimator (@cloud-carbon-footprint/core) with the
// coefficients of its cloud packages, priced with CO2.js's (@tgwf/co2) grid intensities.
// Reads the cases as JSON from its first argument; prints the results and the grid table as JSON.
const path = require('path');
const core = require('@cloud-carbon-footprint/core');
const { averageIntensity } = require('@tgwf/co2');

const cloud = (name, file, constant) =>
  require(path.join(process.env.SLIM_CLOUD_MODULES, '@cloud-carbon-footprint', name, 'dist', 'domain', file))[constant];
const azure = cloud('azure', 'AzureFootprintEstimationConstants', 'AZURE_CLOUD_CONSTANTS');
const aws = cloud('aws', 'AwsFootprintEstimationConstants', 'AWS_CLOUD_CONSTANTS');

// The constants of the cloud that lists the microarchitecture; an unknown one gets Azure's averages.
const constantsFor = (arch) => (arch in azure.MIN_WATTS_BY_COMPUTE_PROCESSOR || !(arch in aws.MIN_WATTS_BY_COMPUTE_PROCESSOR) ? azure : aws);

const out = { cases: [], grid: averageIntensity.data };
for (const c of JSON.parse(process.argv[2])) {
  const k = constantsFor(c.cpu_model);
  const constants = {
    minWatts: k.getMinWatts([c.cpu_model]),
    maxWatts: k.getMaxWatts([c.cpu_model]),
    powerUsageEffectiveness: c.pue,
    replicationFactor: 1,
  };
  const factors = { [c.region]: averageIntensity.data[c.region] };
  const timestamp = new Date(0);
  const [compute] = new core.ComputeEstimator().estimate(
    [{ timestamp, cpuUtilizationAverage: (100 * c.cpu_seconds) / (c.vcpus * c.seconds), vCpuHours: (c.vcpus * c.seconds) / 3600, usesAverageCPUConstant: false }],
    c.region, factors, constants);
  const [memory] = new core.MemoryEstimator(k.MEMORY_COEFFICIENT).estimate(
    [{ timestamp, gigabyteHours: (c.memory_gb * c.seconds) / 3600 }], c.region, factors, constants);
  out.cases.push({
    min_watts: constants.minWatts, max_watts: constants.maxWatts, g_per_kwh: factors[c.region],
    compute_kwh: compute.kilowattHours, compute_gco2e: compute.co2e,
    memory_kwh: memory.kilowattHours, memory_gco2e: memory.co2e,
  });
}
console.log(JSON.stringify(out));
