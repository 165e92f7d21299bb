pub mod pcap;
